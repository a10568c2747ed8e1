// Package command holds what the binaries' commands share: API access from
// a --kubeconfig flag and the flag types the standard library lacks.
package command

import (
	"strconv"
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
)

// RestConfig reaches the API server through kubeconfig, or when it is
// empty in-cluster, else through $KUBECONFIG or ~/.kube/config.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return ctrl.GetConfig()
}

// Float32 is a flag.Value for a client's float32 QPS.
type Float32 float32

func (f *Float32) String() string { return strconv.FormatFloat(float64(*f), 'g', -1, 32) }

func (f *Float32) Set(s string) error {
	v, err := strconv.ParseFloat(s, 32)
	if err != nil {
		return err
	}
	*f = Float32(v)
	return nil
}

// List is a repeatable string flag.
type List []string

func (l *List) String() string { return strings.Join(*l, ",") }

func (l *List) Set(v string) error { *l = append(*l, v); return nil }

// Replacing is a repeatable string flag over a default that its first use
// replaces. An empty value adds nothing, so `--flag=` alone clears it.
type Replacing struct {
	Values  *[]string
	changed bool
}

func (r *Replacing) String() string {
	if r.Values == nil {
		return ""
	}
	return strings.Join(*r.Values, ",")
}

func (r *Replacing) Set(v string) error {
	if !r.changed {
		*r.Values, r.changed = nil, true
	}
	if v != "" {
		*r.Values = append(*r.Values, v)
	}
	return nil
}
