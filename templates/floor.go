package templates

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
)

// FloorGID is the group agent pods run as and own the shared volume by
// (fsGroup) unless the Job sets another: Paperclip's image's.
const FloorGID int64 = 1000

// The security floor: what Pod Security "restricted" requires, plus a fixed
// non-root identity. Render restores it whatever the Job asks for; the
// validating webhook then checks the final pod against "restricted".
const (
	floorUID int64 = 1000
	floorGID int64 = FloorGID
)

// enforcePodFloor raises the pod's security settings to the floor. Values
// already at or above it (a non-root UID other than 1000) are kept.
func enforcePodFloor(spec *corev1.PodSpec) {
	spec.HostNetwork, spec.HostPID, spec.HostIPC = false, false, false
	if spec.SecurityContext == nil {
		spec.SecurityContext = &corev1.PodSecurityContext{}
	}
	sc := spec.SecurityContext
	sc.RunAsNonRoot = ptr.To(true)
	if sc.RunAsUser == nil || *sc.RunAsUser == 0 {
		sc.RunAsUser = ptr.To(floorUID)
	}
	if sc.RunAsGroup == nil || *sc.RunAsGroup == 0 {
		sc.RunAsGroup = ptr.To(floorGID)
	}
	if sc.FSGroup == nil || *sc.FSGroup == 0 {
		sc.FSGroup = ptr.To(floorGID)
	}
	if sc.FSGroupChangePolicy == nil {
		p := corev1.FSGroupChangeOnRootMismatch
		sc.FSGroupChangePolicy = &p
	}
	sc.SeccompProfile = restrictedSeccomp(sc.SeccompProfile)
}

// enforceContainerFloor applies the floor to one container. A container
// setting is removed rather than overridden when the pod-level value covers
// it (runAsUser 0).
func enforceContainerFloor(c *corev1.Container, readOnlyRoot bool) {
	if c.SecurityContext == nil {
		c.SecurityContext = &corev1.SecurityContext{}
	}
	sc := c.SecurityContext
	sc.AllowPrivilegeEscalation = ptr.To(false)
	if sc.Privileged != nil {
		sc.Privileged = ptr.To(false)
	}
	if sc.RunAsNonRoot != nil && !*sc.RunAsNonRoot {
		sc.RunAsNonRoot = ptr.To(true)
	}
	if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		sc.RunAsUser = nil
	}
	if sc.RunAsGroup != nil && *sc.RunAsGroup == 0 {
		sc.RunAsGroup = nil
	}
	if sc.SeccompProfile != nil {
		sc.SeccompProfile = restrictedSeccomp(sc.SeccompProfile)
	}
	if sc.Capabilities == nil {
		sc.Capabilities = &corev1.Capabilities{}
	}
	caps := sc.Capabilities
	if !slices.Contains(caps.Drop, "ALL") {
		caps.Drop = append([]corev1.Capability{"ALL"}, caps.Drop...)
	}
	// "restricted" allows adding back only NET_BIND_SERVICE.
	var add []corev1.Capability
	for _, c := range caps.Add {
		if c == "NET_BIND_SERVICE" {
			add = append(add, c)
		}
	}
	caps.Add = add
	if readOnlyRoot {
		sc.ReadOnlyRootFilesystem = ptr.To(true)
	}
}

func restrictedSeccomp(p *corev1.SeccompProfile) *corev1.SeccompProfile {
	if p != nil && (p.Type == corev1.SeccompProfileTypeRuntimeDefault || p.Type == corev1.SeccompProfileTypeLocalhost) {
		return p
	}
	return &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
}
