// Package config is clipjob's configuration file: the versioned Config type,
// strict decoding that names the path of an unknown or malformed field,
// defaults (including the built-in adapter profiles), validation returning a
// field.ErrorList, and a Store that re-reads the file when it changes and
// keeps serving the previous Config when a new one is refused.
//
// The webhook, the offline CLI and the tests all obtain a *Config through
// Load or Parse, so every consumer sees the same defaults and the same
// validation. A *Config is immutable once returned; reloading swaps pointers.
//
// See testdata/full.yaml for an example file with every field.
package config
