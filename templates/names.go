package templates

import (
	"crypto/sha256"
	"encoding/hex"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/paperclipai/clipjob/contract"
)

// Names of the volumes Render adds to the pod. Every one starts with
// contract.ReservedPrefix, so none meets a volume of the Job's own: a
// client's "data" or "workspace" stays the client's. The names a client
// or an agent relies on are in package contract.
const (
	PromptVolume = contract.ReservedPrefix + "prompt"
	// DataVolume is the shared PersistentVolumeClaim, whatever the source
	// calls it.
	DataVolume = contract.DataVolume
	// WorkspaceVolume is the emptyDir a tenant namespace's agents work in.
	WorkspaceVolume      = contract.ReservedPrefix + "workspace"
	writableVolumePrefix = contract.ReservedPrefix + "writable-"
	secretVolumePrefix   = contract.ReservedPrefix + "secret-"
)

// reservedName is prefix+name, shortened with a hash of name to a valid
// volume name when too long.
func reservedName(prefix, name string) string {
	out := prefix + name
	if len(out) > validation.DNS1123LabelMaxLength {
		sum := sha256.Sum256([]byte(name))
		out = out[:validation.DNS1123LabelMaxLength-9] + "-" + hex.EncodeToString(sum[:4])
	}
	return out
}
