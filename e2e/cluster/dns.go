package cluster

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/net/dns/dnsmessage"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// clusterDomain is the kubelet's clusterDomain.
const clusterDomain = "cluster.local."

// clusterDNS is the cluster's DNS server, for Options.ClusterDNS: what a
// cluster's CoreDNS answers for Services (<service>.<namespace>.svc.
// cluster.local, a Service's ClusterIP), so a manifest written for a real
// cluster reaches another namespace's Service by name, as it would there.
// Every other name is passed to the machine's own resolver.
type clusterDNS struct {
	conn     net.PacketConn
	cs       kubernetes.Interface
	upstream string
}

// startClusterDNS serves on ip:53 (UDP) until stop.
func startClusterDNS(cs kubernetes.Interface, ip string) (*clusterDNS, error) {
	conn, err := net.ListenPacket("udp4", net.JoinHostPort(ip, "53"))
	if err != nil {
		return nil, err
	}
	d := &clusterDNS{conn: conn, cs: cs, upstream: upstreamResolver()}
	go d.serve()
	return d, nil
}

func (d *clusterDNS) stop() { _ = d.conn.Close() }

// upstreamResolver is the machine's first nameserver (the pods' resolver
// before the cluster had one).
func upstreamResolver() string {
	data, _ := os.ReadFile("/etc/resolv.conf")
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "nameserver" {
			return net.JoinHostPort(f[1], "53")
		}
	}
	return "127.0.0.1:53"
}

func (d *clusterDNS) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := d.conn.ReadFrom(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		query := append([]byte(nil), buf[:n]...)
		go func() {
			if reply := d.answer(query); reply != nil {
				_, _ = d.conn.WriteTo(reply, from)
			}
		}()
	}
}

// answer replies to one query: a cluster name from the API server, any
// other passed on.
func (d *clusterDNS) answer(query []byte) []byte {
	var p dnsmessage.Parser
	h, err := p.Start(query)
	if err != nil {
		return nil
	}
	q, err := p.Question()
	if err != nil {
		return nil
	}
	name := strings.ToLower(q.Name.String())
	if name != clusterDomain && !strings.HasSuffix(name, "."+clusterDomain) {
		return d.forward(query)
	}
	resp := dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true, RecursionDesired: h.RecursionDesired, RCode: dnsmessage.RCodeNameError}
	var ip net.IP
	labels := strings.Split(strings.TrimSuffix(name, "."+clusterDomain), ".")
	if len(labels) == 3 && labels[2] == "svc" {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		svc, err := d.cs.CoreV1().Services(labels[1]).Get(ctx, labels[0], metav1.GetOptions{})
		cancel()
		if err == nil {
			resp.RCode = dnsmessage.RCodeSuccess // the name exists, whatever the type asked
			if q.Type == dnsmessage.TypeA && svc.Spec.ClusterIP != corev1.ClusterIPNone {
				ip = net.ParseIP(svc.Spec.ClusterIP).To4()
			}
		}
	}
	b := dnsmessage.NewBuilder(nil, resp)
	b.EnableCompression()
	_ = b.StartQuestions()
	_ = b.Question(q)
	_ = b.StartAnswers()
	if ip != nil {
		var a dnsmessage.AResource
		copy(a.A[:], ip)
		_ = b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, a)
	}
	out, err := b.Finish()
	if err != nil {
		return nil
	}
	return out
}

// forward passes query to the machine's resolver and returns its reply.
func (d *clusterDNS) forward(query []byte) []byte {
	c, err := net.DialTimeout("udp", d.upstream, 5*time.Second)
	if err != nil {
		return nil
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(query); err != nil {
		return nil
	}
	buf := make([]byte, 4096)
	n, err := c.Read(buf)
	if err != nil {
		return nil
	}
	return buf[:n]
}
