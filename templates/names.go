package templates

// Names of what Render adds to the pod. The names a client or an agent
// relies on are in package contract.
const (
	PromptVolume         = "clipjob-prompt"
	writableVolumePrefix = "clipjob-writable-"
	dataVolumeDefault    = "paperclip-data"
)
