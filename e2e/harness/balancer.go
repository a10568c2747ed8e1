package harness

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Balancer spreads TCP connections over several webhook replicas in turn,
// as a Service would, so the API server's admission calls reach all of
// them. TLS passes through untouched.
type Balancer struct {
	Addr     string
	backends []string
	next     atomic.Uint64
	ln       net.Listener
	wg       sync.WaitGroup
}

// StartBalancer listens on a free loopback port.
func StartBalancer(backends ...string) (*Balancer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	b := &Balancer{Addr: ln.Addr().String(), backends: backends, ln: ln}
	b.wg.Add(1)
	go b.serve()
	return b, nil
}

func (b *Balancer) serve() {
	defer b.wg.Done()
	for {
		in, err := b.ln.Accept()
		if err != nil {
			return
		}
		backend := b.backends[b.next.Add(1)%uint64(len(b.backends))]
		go func() {
			defer in.Close()
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
	_ = b.ln.Close()
	b.wg.Wait()
}
