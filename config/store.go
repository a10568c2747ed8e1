package config

import (
	"bytes"
	"context"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"
)

// Store holds the Config in force. Readers call Current on every request;
// a reload swaps the pointer, so a request sees one whole Config.
type Store struct {
	current atomic.Pointer[Config]

	mu     sync.Mutex
	status Status
	// content is the file content the Config in force came from, so Watch
	// applies only a change; nil for a Store made from a parsed Config.
	content []byte
}

// Status describes the last reload attempt, for logs, metrics and probes.
type Status struct {
	// Hash of the Config in force.
	Hash string
	// LoadedAt is when the Config in force was loaded.
	LoadedAt time.Time
	// Refused is the error of the newest file content that failed to load,
	// empty once a later content loads. While it is set, the previous
	// Config keeps serving.
	Refused string
	// RefusedAt is when that content was refused.
	RefusedAt time.Time
}

// NewStore returns a Store serving cfg, loaded at now.
func NewStore(cfg *Config, now time.Time) *Store {
	s := &Store{}
	s.current.Store(cfg)
	s.status = Status{Hash: cfg.Hash(), LoadedAt: now}
	return s
}

// LoadStore reads the file at path into a new Store, loaded at now. Unlike
// a reload, a file that cannot be read or parsed is an error: there is no
// previous Config to keep serving.
func LoadStore(path string, now time.Time) (*Store, error) {
	cfg, data, err := load(path)
	if err != nil {
		return nil, err
	}
	s := NewStore(cfg, now)
	s.content = data
	return s, nil
}

// Current returns the Config in force.
func (s *Store) Current() *Config { return s.current.Load() }

// Status returns the state of the last reload.
func (s *Store) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status
}

// Apply parses data and, if it is valid, makes it the Config in force.
// Invalid data is refused and the previous Config keeps serving.
func (s *Store) Apply(data []byte, now time.Time) (*Config, error) {
	cfg, err := Parse(data)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.status.Refused, s.status.RefusedAt = err.Error(), now
		return nil, err
	}
	s.current.Store(cfg)
	s.status = Status{Hash: cfg.Hash(), LoadedAt: now}
	s.content = data
	return cfg, nil
}

// WatchOptions tune Watch.
type WatchOptions struct {
	// Interval between reads of the file. Default 2s. The file is small and
	// a mounted ConfigMap changes by an atomic symlink swap, so polling the
	// content is both cheap and immune to missed filesystem events.
	Interval time.Duration
	// Clock drives the polling. Default the real clock.
	Clock clock.WithTicker
	// OnReload is called after each attempt to load changed content, with
	// the new Config or the error that refused it.
	OnReload func(*Config, error)
}

// Watch re-reads path until ctx ends and applies it whenever its content
// differs from what was last read (at first, what the Store was loaded
// from). A file that cannot be read counts as refused content; the Config
// in force stays.
func (s *Store) Watch(ctx context.Context, path string, opts WatchOptions) {
	if opts.Interval <= 0 {
		opts.Interval = 2 * time.Second
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	s.mu.Lock()
	last, lastReadErr := s.content, ""
	s.mu.Unlock()
	t := opts.Clock.NewTicker(opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		data, err := os.ReadFile(path)
		var cfg *Config
		switch {
		case err != nil:
			if err.Error() == lastReadErr {
				continue // reported already
			}
			lastReadErr, last = err.Error(), nil
			s.mu.Lock()
			s.status.Refused, s.status.RefusedAt = err.Error(), opts.Clock.Now()
			s.mu.Unlock()
		case bytes.Equal(data, last):
			continue
		default:
			lastReadErr, last = "", data
			cfg, err = s.Apply(data, opts.Clock.Now())
		}
		if opts.OnReload != nil {
			opts.OnReload(cfg, err)
		}
	}
}
