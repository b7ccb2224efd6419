package main

import (
	"io"
	"sort"
	"time"

	"github.com/spf13/cobra"

	"github.com/fluidos-project/resource-broker/broker/api"
)

func newClustersCommand(g *globalOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "clusters",
		Aliases: []string{"cluster", "cl"},
		Short:   "List the clusters advertised to the broker",
		Long: `clusters lists every cluster the broker knows, live or stale, with its free
and allocatable CPU, memory and GPUs, its price per core-hour and how long ago
it last advertised.`,
		Example: `  rbctl clusters
  rbctl clusters -o yaml --cert-dir .certs/clusters/paris`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			clusters, err := c.Clusters(cmd.Context())
			if err != nil {
				return err
			}
			sort.Slice(clusters, func(i, j int) bool { return clusters[i].ClusterID < clusters[j].ClusterID })
			if done, err := g.printStructured(cmd.OutOrStdout(), clusters); done {
				return err
			}
			return printClusters(cmd.OutOrStdout(), clusters, time.Now())
		},
	}
}

func printClusters(out io.Writer, clusters []api.Cluster, now time.Time) error {
	w := newTabWriter(out)
	row(w, "NAME", "LIVE", "CPU(free/alloc)", "MEMORY(free/alloc)", "GPU", "PRICE/CORE-H", "LAST-SEEN")
	for _, c := range clusters {
		res := c.Resources
		free := api.Quantities{}
		if res.Available != nil {
			free = *res.Available
		}
		live := "no"
		if c.Live {
			live = "yes"
		}
		gpu := "-"
		if res.Allocatable.GPU != nil && !res.Allocatable.GPU.IsZero() {
			gpu = count(free.GPU) + "/" + count(res.Allocatable.GPU)
		}
		price := "-"
		if c.Prices != nil && c.Prices.CPU != nil {
			price = decimal(c.Prices.CPU)
			if c.Prices.Currency != "" {
				price += " " + c.Prices.Currency
			}
		}
		row(w, c.ClusterID, live,
			cores(free.CPU)+"/"+cores(res.Allocatable.CPU),
			bytesHuman(free.Memory)+"/"+bytesHuman(res.Allocatable.Memory),
			gpu, price, ago(now, c.SeenAt))
	}
	return w.Flush()
}
