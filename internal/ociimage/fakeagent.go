package ociimage

import (
	"debug/elf"
	"fmt"
)

// AgentCLIs are the commands clipjob's built-in profiles run: in the test
// images each is the fake agent (e2e/images/fakeagent).
var AgentCLIs = []string{"claude", "opencode", "codex", "gemini", "cursor-agent", "pi"}

// ShellTools are the busybox applets the profiles' `sh -c` commands use,
// and those a hostile agent reaches for in a test's own command (links on
// the shared volume, connections out).
var ShellTools = []string{"sh", "cat", "env", "id", "ls", "mkdir", "rm", "sleep", "stat", "touch", "wc", "head", "tail",
	"ln", "cp", "mv", "chmod", "grep", "readlink", "find", "echo", "printf", "nc", "wget", "ps", "kill", "mount", "df"}

// FakeAgentFiles are the fake agent (a static build of e2e/images/fakeagent
// at agent) under every agent CLI's name in /usr/local/bin, and a static
// busybox in /bin with ShellTools, for the profiles' shell commands.
func FakeAgentFiles(agent, busybox string) ([]File, error) {
	f, err := elf.Open(busybox)
	if err != nil {
		return nil, fmt.Errorf("busybox %s: %w (install Debian's busybox-static: hack/node-packages.sh)", busybox, err)
	}
	interp := f.Section(".interp")
	f.Close()
	if interp != nil {
		return nil, fmt.Errorf("%s is dynamically linked; install Debian's busybox-static (hack/node-packages.sh)", busybox)
	}
	files := []File{
		{Path: "/bin/busybox", Source: busybox},
		{Path: "/usr/local/bin/fakeagent", Source: agent},
	}
	for _, t := range ShellTools {
		files = append(files, File{Path: "/bin/" + t, Link: "busybox"})
	}
	for _, cli := range AgentCLIs {
		files = append(files, File{Path: "/usr/local/bin/" + cli, Link: "fakeagent"})
	}
	return files, nil
}
