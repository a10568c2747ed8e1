// Command clipjob-webhook serves clipjob's admission webhooks. See app for
// its flags.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/paperclipai/clipjob/cmd/clipjob-webhook/app"
	"github.com/paperclipai/clipjob/webhook"
)

func main() {
	os.Exit(app.Main(ctrl.SetupSignalHandler(), os.Args[1:], os.Stderr, webhook.Run))
}
