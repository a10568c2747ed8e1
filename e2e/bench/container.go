package main

import (
	"runtime"

	corev1 "k8s.io/api/core/v1"
)

// baselineContainer is what a client must send when no webhook completes
// the Job: the same Job the webhook would produce, in its smallest form.
func baselineContainer() corev1.Container {
	return corev1.Container{Name: "agent", Image: "ghcr.io/paperclipai/paperclip:v2026.11.3", Command: []string{"claude"}}
}

func cpus() int { return runtime.NumCPU() }
