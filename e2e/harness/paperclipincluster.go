package harness

import (
	"context"
	"encoding/json"
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
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
	"k8s.io/client-go/util/retry"
	streamhttp "k8s.io/streaming/pkg/httpstream"

	"github.com/paperclipai/clipjob/e2e/cluster"
)

// What running Paperclip in the cluster takes: its image on the real
// node, its API reached from the test, and a namespace the suite's own
// install leaves alone.

var paperclipImageOnce struct {
	sync.Once
	ref string
	err error
}

// LoadPaperclipImage loads `make paperclip-image`'s image
// (hack/paperclip/image.sh, under its default tag) into the real node,
// once per test binary, and returns its reference. The script keeps the
// archive in the project's cache, keyed by its inputs: only a first run,
// or one after the adapter, the fake agent, Paperclip's install or the
// image's code changed, builds it.
func LoadPaperclipImage(ctx context.Context, c *cluster.Cluster) (string, error) {
	paperclipImageOnce.Do(func() {
		paperclipImageOnce.ref, paperclipImageOnce.err = loadPaperclipImage(ctx, c)
	})
	return paperclipImageOnce.ref, paperclipImageOnce.err
}

func loadPaperclipImage(ctx context.Context, c *cluster.Cluster) (string, error) {
	version, err := PaperclipVersion()
	if err != nil {
		return "", err
	}
	ref := "docker.io/local/paperclip-clipjob:" + version
	// Built under the suite's lock: the adapter's other tests run its
	// dist/ meanwhile, which an npm ci would pull from under them.
	if err := EnsureAdapterBuilt(); err != nil {
		return "", err
	}
	start := time.Now()
	archive := filepath.Join(c.Dir, "paperclip-image.tar")
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(Root(), "hack", "paperclip", "image.sh"), archive, ref)
	cmd.Dir = Root()
	cmd.Env = append(os.Environ(), "CLIPJOB_ADAPTER_BUILT=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("hack/paperclip/image.sh: %w\n%s", err, out)
	}
	made := time.Since(start)
	defer os.Remove(archive) // a link to the cached archive
	if err := c.LoadImage(ctx, archive); err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "e2e: the Paperclip image: %s in %s, loaded into the real node in %s\n", lastLine(string(out)),
		made.Round(100*time.Millisecond), (time.Since(start) - made).Round(100*time.Millisecond))
	return ref, nil
}

// PaperclipVersion is the paperclipai version the suite installs
// (hack/paperclip/server/package.json).
func PaperclipVersion() (string, error) {
	data, err := os.ReadFile(filepath.Join(Root(), "hack", "paperclip", "server", "package.json"))
	if err != nil {
		return "", err
	}
	var pkg struct{ Dependencies map[string]string }
	if err := json.Unmarshal(data, &pkg); err != nil {
		return "", err
	}
	v := pkg.Dependencies["paperclipai"]
	if v == "" {
		return "", errors.New("hack/paperclip/server/package.json names no paperclipai")
	}
	return v, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimPrefix(lines[len(lines)-1], "paperclip-image: ")
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
