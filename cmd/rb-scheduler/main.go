// Command rb-scheduler is kube-scheduler with the ResourceBroker plugin
// compiled in. It runs as a secondary scheduler (profile "resource-broker",
// see manifests/scheduler): pods with `schedulerName: resource-broker` that
// fit no local node get a broker Reservation and are bound to the
// provider's virtual node. Every kube-scheduler flag applies; the plugin is
// configured in the KubeSchedulerConfiguration given with --config.
package main

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // for version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"

	"github.com/fluidos-project/resource-broker/plugins/resourcebroker"
)

// newCommand is kube-scheduler's command with our plugin registered.
func newCommand() *cobra.Command {
	cmd := app.NewSchedulerCommand(app.WithPlugin(resourcebroker.Name, resourcebroker.New))
	cmd.Use = "rb-scheduler"
	return cmd
}

func main() {
	os.Exit(cli.Run(newCommand()))
}
