// Command clipjob renders and checks agent Jobs offline with the same code
// as the webhook. See app for the commands.
package main

import (
	"os"

	"github.com/paperclipai/clipjob/cmd/clipjob/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
