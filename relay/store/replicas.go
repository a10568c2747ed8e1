package store

import (
	"context"
	"time"
)

// Replica is a live relay replica as a shared store's table of replicas
// holds it: its random id, which the division of runs hashes, and the
// name it was started with (its pod's), for people.
type Replica struct {
	ID, Name string
}

// ReplicaTable is a shared store's table of replicas (relay/replicas
// divides the runs over its live rows). A store one relay alone uses has
// none.
type ReplicaTable interface {
	// Renew records replica id, named name, as live for ttl from the
	// server's now(), and returns every live replica, id included.
	Renew(ctx context.Context, id, name string, ttl time.Duration) ([]Replica, error)
	// Leave deletes replica id's row.
	Leave(ctx context.Context, id string) error
}
