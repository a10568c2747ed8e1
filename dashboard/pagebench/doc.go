// Package pagebench measures the runs page in headless Chromium with a
// long log: how long 100,000 lines take to arrive and draw, the longest
// the page's main thread was blocked meanwhile, a search over them and a
// redraw after a jump (make bench; docs/benchmarks.md). It needs Chromium
// (make chromium) and no cluster: the relay and the API server are
// stand-ins serving one run.
package pagebench
