package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/client-go/util/retry"
	streamhttp "k8s.io/streaming/pkg/httpstream"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

// What running Paperclip in the cluster takes: its image on the real
// node, a relay its pod can reach, its API reached from the test, and a
// namespace the suite's own install leaves alone.

// PaperclipImage is the tag the suite loads the Paperclip image under
// (`make paperclip-image`'s, docs/paperclip.md).
const PaperclipImage = "docker.io/local/paperclip-clipjob:e2e"

var paperclipImageOnce struct {
	sync.Once
	err error
}

// LoadPaperclipImage builds the Paperclip image as `make paperclip-image`
// does (hack/paperclip/image.sh) and loads it into the real node, once per
// test binary.
func LoadPaperclipImage(ctx context.Context, c *cluster.Cluster) (string, error) {
	paperclipImageOnce.Do(func() {
		// Built under the suite's lock: the adapter's other tests run its
		// dist/ meanwhile, which an npm ci would pull from under them.
		if err := EnsureAdapterBuilt(); err != nil {
			paperclipImageOnce.err = err
			return
		}
		archive := filepath.Join(c.Dir, "paperclip-image.tar")
		cmd := exec.CommandContext(ctx, "bash", filepath.Join(Root(), "hack", "paperclip", "image.sh"), archive, PaperclipImage)
		cmd.Dir = Root()
		cmd.Env = append(os.Environ(), "CLIPJOB_ADAPTER_BUILT=1")
		out, err := cmd.CombinedOutput()
		if err != nil {
			paperclipImageOnce.err = fmt.Errorf("hack/paperclip/image.sh: %w\n%s", err, out)
			return
		}
		fmt.Fprintf(os.Stderr, "e2e: %s", lastLine(string(out)))
		paperclipImageOnce.err = c.LoadImage(ctx, archive)
		_ = os.RemoveAll(archive + ".d")
	})
	return PaperclipImage, paperclipImageOnce.err
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1] + "\n"
}

// PodRelay starts a relay for the install's namespace that pods reach: on
// the real node's address, with a certificate naming it. (The install's
// own relay listens on loopback, for processes of this machine.)
func (in *Install) PodRelay(ctx context.Context) (*Relay, error) {
	ip := in.c.RealNodeIP()
	if ip == "" {
		return nil, errors.New("a relay pods reach needs the real node")
	}
	bin, err := BuildOnce(in.c.Dir, "clipjob-relay")
	if err != nil {
		return nil, err
	}
	certs := filepath.Join(in.Dir(), "pod-relay-certs")
	kp, err := in.c.CA.Serving("clipjob-relay", ip, "127.0.0.1")
	if err != nil {
		return nil, err
	}
	if err := kp.WriteTLS(certs); err != nil {
		return nil, err
	}
	ports, err := cluster.FreePorts(1)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("%s:%d", ip, ports[0])
	// The later flags win over StartRelay's loopback ones.
	r, err := StartRelay(ctx, in.c, bin, in.name("pod-relay"), in.Namespace, "--api-address", addr, "--cert-dir", certs)
	if err != nil {
		return nil, err
	}
	r.APIAddr = addr
	return r, nil
}

// ExcludeNamespace takes namespace out of a cluster-wide install's
// webhook configurations, as the chart's webhook.excludeNamespaces does,
// so that an install of the namespace's own alone judges its Jobs and
// pods. Other namespaces are judged as before.
func (in *Install) ExcludeNamespace(ctx context.Context, namespace string) error {
	if !in.wide {
		return errors.New("only a cluster-wide install is registered for namespaces it does not own")
	}
	exclude := func(sel **metav1.LabelSelector) {
		if *sel == nil {
			*sel = &metav1.LabelSelector{}
		}
		for i, e := range (*sel).MatchExpressions {
			if e.Key == corev1.LabelMetadataName && e.Operator == metav1.LabelSelectorOpNotIn {
				if !slices.Contains(e.Values, namespace) {
					(*sel).MatchExpressions[i].Values = append(e.Values, namespace)
				}
				return
			}
		}
		(*sel).MatchExpressions = append((*sel).MatchExpressions, metav1.LabelSelectorRequirement{
			Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{namespace}})
	}
	ar := in.c.Clientset().AdmissionregistrationV1()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		m, err := ar.MutatingWebhookConfigurations().Get(ctx, in.MutatingWebhookName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range m.Webhooks {
			exclude(&m.Webhooks[i].NamespaceSelector)
		}
		_, err = ar.MutatingWebhookConfigurations().Update(ctx, m, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("excluding %s from %s: %w", namespace, in.MutatingWebhookName(), err)
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		v, err := ar.ValidatingWebhookConfigurations().Get(ctx, in.ValidatingWebhookName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		for i := range v.Webhooks {
			exclude(&v.Webhooks[i].NamespaceSelector)
		}
		_, err = ar.ValidatingWebhookConfigurations().Update(ctx, v, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("excluding %s from %s: %w", namespace, in.ValidatingWebhookName(), err)
	}
	return nil
}

// PortForward forwards a free port of this machine to port of pod, as
// `kubectl port-forward` does (the API server, then the kubelet, into the
// pod's network namespace: a server bound to the pod's loopback is
// reached). It returns the local address and a function that stops it.
func PortForward(ctx context.Context, c *cluster.Cluster, namespace, pod string, port int) (string, func(), error) {
	transport, upgrader, err := spdy.RoundTripperFor(c.Config)
	if err != nil {
		return "", nil, err
	}
	url := c.Clientset().CoreV1().RESTClient().Post().Resource("pods").Namespace(namespace).Name(pod).SubResource("portforward").URL()
	// As kubectl dials: WebSockets first, SPDY when the upgrade is refused.
	tunneling, err := portforward.NewSPDYOverWebsocketDialerForStreaming(url, c.Config)
	if err != nil {
		return "", nil, err
	}
	dialer := portforward.NewFallbackDialerForStreaming(tunneling,
		spdy.NewDialerForStreaming(upgrader, &http.Client{Transport: transport}, http.MethodPost, url),
		func(err error) bool { return streamhttp.IsUpgradeFailure(err) || streamhttp.IsHTTPSProxyError(err) })
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddressesForStreaming(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return "", nil, err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		return "", nil, fmt.Errorf("port-forward to %s/%s:%d: %w", namespace, pod, port, err)
	case <-ctx.Done():
		close(stop)
		return "", nil, ctx.Err()
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		close(stop)
		return "", nil, fmt.Errorf("port-forward to %s/%s:%d: no local port (%v)", namespace, pod, port, err)
	}
	var once sync.Once
	return fmt.Sprintf("127.0.0.1:%d", ports[0].Local), func() { once.Do(func() { close(stop) }) }, nil
}
