// Command clipjob-relay follows every agent pod's logs, keeps them and
// serves them with the run's result. See package relay, and app for its
// flags.
package main

import (
	"os"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/paperclipai/clipjob/cmd/clipjob-relay/app"
	"github.com/paperclipai/clipjob/relay"
)

func main() {
	os.Exit(app.Main(ctrl.SetupSignalHandler(), os.Args[1:], os.Stderr, relay.Serve))
}
