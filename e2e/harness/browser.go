package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"k8s.io/apimachinery/pkg/util/wait"
)

// ChromiumEnv names the browser the page tests drive, when it is not
// the chromium on PATH.
const ChromiumEnv = "CLIPJOB_CHROMIUM"

// Browser is one headless Chromium tab, driven over the Chrome DevTools
// protocol.
type Browser struct {
	ctx context.Context
	t   testing.TB
}

// NewBrowser starts headless Chromium (Debian's package, installed by
// hack/chromium-packages.sh) with a window of width×height CSS pixels in
// time zone zone, closed when t ends. Without Chromium the test fails
// naming how to install it, as the real-node tier does for its packages.
func NewBrowser(t testing.TB, width, height int, zone string) *Browser {
	t.Helper()
	path := os.Getenv(ChromiumEnv)
	if path == "" {
		var err error
		if path, err = exec.LookPath("chromium"); err != nil {
			t.Fatalf("the runs page's browser tests need Chromium: run `make chromium` (hack/chromium-packages.sh: apt-get install chromium), or point %s at a Chromium binary", ChromiumEnv)
		}
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // tests run as root, where Chromium's sandbox will not start
		chromedp.WindowSize(width, height),
		chromedp.UserDataDir(filepath.Join(t.TempDir(), "chromium")),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	b := &Browser{ctx: ctx, t: t}
	// The first action starts the browser, which lives as long as the
	// context of that call: no timeout on it.
	viewport := []chromedp.EmulateViewportOption{}
	if width < 700 {
		viewport = append(viewport, chromedp.EmulateMobile)
	}
	err := chromedp.Do(ctx,
		chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
			_, err := cdp.Call(ctx, t, emulation.SetTimezoneOverride, emulation.SetTimezoneOverrideParams{TimezoneID: zone})
			return err
		}),
		chromedp.EmulateViewport(int64(width), int64(height), viewport...))
	if err != nil {
		t.Fatalf("starting Chromium (%s): %v", path, err)
	}
	return b
}

// Do runs steps in the tab, failing the test on an error.
func (b *Browser) Do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("browser: %v", err)
	}
}

// Eval evaluates a JavaScript expression in the page and returns its
// value as JSON (chromedp.EvalAwaitPromise: the value a promise settles to).
func (b *Browser) Eval(expr string, opts ...chromedp.EvaluateOption) (json.RawMessage, error) {
	ctx, cancel := context.WithTimeout(b.ctx, 3*time.Minute)
	defer cancel()
	return chromedp.Run(ctx, chromedp.Evaluate[[]byte](expr, opts...))
}

// Wait polls expr, a JavaScript expression, until ok accepts its value
// (decoded from JSON into a fresh T), for up to three minutes, and
// returns it; the test fails naming what was awaited and the last value.
func Wait[T any](b *Browser, what, expr string, ok func(T) bool) T {
	b.t.Helper()
	var last T
	var lastErr error
	err := wait.PollUntilContextTimeout(b.ctx, 100*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		var raw json.RawMessage
		if raw, lastErr = b.Eval(expr); lastErr != nil {
			return false, nil
		}
		var v T
		if lastErr = json.Unmarshal(raw, &v); lastErr != nil {
			return false, nil
		}
		last = v
		return ok(v), nil
	})
	if err != nil {
		b.t.Fatalf("the page did not show %s: last %+v (error %v)", what, last, lastErr)
	}
	return last
}

// Screenshot writes the page as a PNG to dir/name.png, when dir is set.
func (b *Browser) Screenshot(dir, name string) {
	b.t.Helper()
	if dir == "" {
		return
	}
	ctx, cancel := context.WithTimeout(b.ctx, time.Minute)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err = os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(fmt.Errorf("writing the screenshot: %w", err))
	}
}
