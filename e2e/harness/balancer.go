package harness

import (
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Balancer spreads TCP connections over several webhook replicas in turn,
// as a Service would, so the API server's admission calls reach all of
// them. TLS passes through untouched. Started with probes, it sends new
// connections only to replicas whose /readyz answers 200, as a Service's
// endpoints do.
type Balancer struct {
	Addr     string
	backends []string
	probes   []string
	ready    []atomic.Bool
	next     atomic.Uint64
	ln       net.Listener
	wg       sync.WaitGroup
	stop     chan struct{}
}

// StartBalancer listens on a free loopback port.
func StartBalancer(backends ...string) (*Balancer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &Balancer{Addr: ln.Addr().String(), backends: backends, ln: ln, ready: make([]atomic.Bool, len(backends)), stop: make(chan struct{})}
	for i := range b.ready {
		b.ready[i].Store(true)
	}
	b.wg.Add(1)
	go b.serve()
	return b, nil
}

// StartServiceBalancer is StartBalancer over replicas, following their
// readiness as a Service's endpoints do (polled every 100ms).
func StartServiceBalancer(replicas ...*Webhook) (*Balancer, error) {
	var addrs []string
	for _, r := range replicas {
		addrs = append(addrs, r.Addr)
	}
	b, err := StartBalancer(addrs...)
	if err != nil {
		return nil, err
	}
	for _, r := range replicas {
		b.probes = append(b.probes, r.ProbeAddr)
	}
	b.wg.Add(1)
	go b.watchReadiness()
	return b, nil
}

func (b *Balancer) watchReadiness() {
	defer b.wg.Done()
	client := &http.Client{Timeout: time.Second}
	for {
		for i, p := range b.probes {
			resp, err := client.Get("http://" + p + "/readyz")
			ok := err == nil && resp.StatusCode == http.StatusOK
			if err == nil {
				resp.Body.Close()
			}
			b.ready[i].Store(ok)
		}
		select {
		case <-b.stop:
			return
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Routes reports whether new connections may go to backend addr: its
// last probe found it ready (always, for a balancer without probes).
func (b *Balancer) Routes(addr string) bool {
	for i, a := range b.backends {
		if a == addr {
			return b.ready[i].Load()
		}
	}
	return false
}

// pick returns the next ready backend, or "" if none is.
func (b *Balancer) pick() string {
	for range b.backends {
		i := b.next.Add(1) % uint64(len(b.backends))
		if b.ready[i].Load() {
			return b.backends[i]
		}
	}
	return ""
}

func (b *Balancer) serve() {
	defer b.wg.Done()
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		backend := b.pick()
		go func() {
			defer in.Close()
			if backend == "" {
				return // no endpoint: refused, as by a Service with none
			}
			out, err := net.Dial("tcp", backend)
			if err != nil {
				return
			}
			defer out.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(out, in); done <- struct{}{} }()
			go func() { _, _ = io.Copy(in, out); done <- struct{}{} }()
			<-done
		}()
	}
}

// Stop closes the listener.
func (b *Balancer) Stop() {
	close(b.stop)
	_ = b.ln.Close()
	b.wg.Wait()
}
