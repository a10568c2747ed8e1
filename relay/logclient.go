package relay

import (
	"net"
	"net/http"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/transport"
)

// The HTTP/2 settings of the log streams' connections to the API server.
// client-go's transport leaves Go's: a 4 MiB receive window per stream,
// so each followed log could hold 4 MiB the relay had not read yet, which
// it does whenever commits fall behind (a flood, a slow fsync), and
// frames of up to 1 MiB. 32 KiB, half of HTTP/2's own initial window,
// is 16 MiB for 500 streams at most, and still carries megabytes a
// second a stream at a millisecond's round trip (an agent writes
// kilobytes): the rest of a burst waits in the kubelet's log file, read
// when the relay has room.
//
// A connection's window bounds what all its streams hold together: Go's
// is 1 GiB, so hundreds of streams the relay is behind on (a flood, where
// readers wait for the collector's budget of lines) each filled their
// own, 16 MiB at 500 streams. With 1 MiB a connection (the API server
// carries hundreds of streams on one), what the relay has not read is
// bounded by its connections, not its streams, and the rest waits in the
// log files. The window comes back as the relay reads any of them, and a
// stream holding lines commits them without reading more, so a stream
// whose data sits unread cannot keep the others from theirs for good.
const (
	logStreamWindow    = 32 << 10
	logConnWindow      = 1 << 20
	logStreamFrameSize = 16 << 10
)

// logClient is a client for the log streams only: its own connections to
// the API server, with HTTP/2 windows sized for hundreds of streams
// (logStreamWindow). Authentication, TLS and the rate limit are rc's, as
// client-go builds them (client certificate files are re-read at each
// handshake); the rest of the relay keeps client-go's shared transport.
// Unlike that one, it does not swap in a CA file rotated while the relay
// runs (client-go's ClientsAllowCARotation): the relay's next start does.
func logClient(rc *rest.Config) (kubernetes.Interface, error) {
	tc, err := rc.TransportConfig()
	if err != nil {
		return nil, err
	}
	tlsConfig, err := transport.TLSConfigFor(tc)
	if err != nil {
		return nil, err
	}
	dial := (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext
	if tc.DialHolder != nil {
		dial = tc.DialHolder.Dial
	}
	proxy := http.ProxyFromEnvironment
	if tc.Proxy != nil {
		proxy = tc.Proxy
	}
	// SetTransportDefaults enables HTTP/2 as client-go does (with its
	// connection health checks); the HTTP/2 transport reads HTTP2 below.
	t := utilnet.SetTransportDefaults(&http.Transport{
		Proxy:               proxy,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig:     tlsConfig,
		MaxIdleConnsPerHost: 25,
		DialContext:         dial,
		DisableCompression:  tc.DisableCompression,
		HTTP2: &http.HTTP2Config{
			MaxReceiveBufferPerStream:     logStreamWindow,
			MaxReceiveBufferPerConnection: logConnWindow,
			MaxReadFrameSize:              logStreamFrameSize,
		},
	})
	rt, err := transport.HTTPWrappersForConfig(tc, t)
	if err != nil {
		return nil, err
	}
	return kubernetes.NewForConfigAndClient(rc, &http.Client{Transport: rt, Timeout: rc.Timeout})
}
