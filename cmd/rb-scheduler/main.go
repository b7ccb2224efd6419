// Command rb-scheduler is kube-scheduler with the ResourceBroker plugin
// compiled in. It runs as a secondary scheduler (profile "resource-broker",
// see manifests/scheduler): pods with `schedulerName: resource-broker` that
// fit no local node get a broker Reservation and are bound to the
// provider's virtual node. Every kube-scheduler flag applies; the plugin is
// configured in the KubeSchedulerConfiguration given with --config.
// scheduler-plugins' Coscheduling is built in too, for gangs (PodGroups):
// a profile that enables it binds a group's members together.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // for version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	_ "sigs.k8s.io/scheduler-plugins/apis/config/scheme" // CoschedulingArgs in the configuration's scheme
	"sigs.k8s.io/scheduler-plugins/pkg/coscheduling"

	"github.com/fluidos-project/resource-broker/internal/version"
	"github.com/fluidos-project/resource-broker/plugins/resourcebroker"
)

// newCommand is kube-scheduler's command with our plugin registered.
func newCommand() *cobra.Command {
	cmd := app.NewSchedulerCommand(app.WithPlugin(resourcebroker.Name, resourcebroker.New),
		app.WithPlugin(coscheduling.Name, coscheduling.New))
	cmd.Use = "rb-scheduler"
	// kube-scheduler's --version (component-base's verflag) prints
	// component-base's version, which the build stamps with the Kubernetes
	// release it is (metrics and feature gates go by it): plain --version
	// prints ours and that release; --version=raw is kube-scheduler's own.
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		if f := c.Flags().Lookup("version"); f != nil && f.Value.String() == "true" {
			_, err := fmt.Fprintf(c.OutOrStdout(), "rb-scheduler %s, kube-scheduler %s\n", version.Get(), version.Module("k8s.io/kubernetes"))
			return err
		}
		return run(c, args)
	}
	return cmd
}

func main() {
	os.Exit(cli.Run(newCommand()))
}
