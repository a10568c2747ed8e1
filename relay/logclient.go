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
// Go's defaults (a 4 MiB window per stream, 1 GiB per connection) let
// each followed log hold megabytes the relay has not read whenever its
// commits fall behind. 32 KiB a stream still carries megabytes a second,
// and 1 MiB a connection bounds what the relay has not read by its
// connections, not its streams: the rest waits in the kubelets' log
// files. A stream holding lines commits them without reading more, so
// one whose data sits unread cannot keep the others' window for good.
const (
	logStreamWindow    = 32 << 10
	logConnWindow      = 1 << 20
	logStreamFrameSize = 16 << 10
)

// logClient is a client for the log streams only, with HTTP/2 windows
// sized for hundreds of streams. Authentication, TLS and the rate limit
// are rc's, as client-go builds them; unlike client-go's shared
// transport, it does not swap in a CA file rotated while the relay runs
// (the relay's next start does).
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
