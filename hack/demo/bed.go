package main

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/fluidos-project/resource-broker/internal/testbed"
)

// emptyDir removes dir's contents (a previous run's), keeping dir.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

func brokerAddrs(bed *testbed.Bed) string {
	var a []string
	for _, b := range bed.Brokers {
		a = append(a, b.Addr)
	}
	return strings.Join(a, ", ")
}

// copyKubeconfigs writes <cluster>.kubeconfig for each cluster into dir.
func copyKubeconfigs(bed *testbed.Bed, dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, c := range bed.Clusters {
		data, err := os.ReadFile(c.Kubeconfig)
		if err != nil {
			return nil, err
		}
		p := filepath.Join(dir, c.Name+".kubeconfig")
		if err := os.WriteFile(p, data, 0o600); err != nil {
			return nil, err
		}
		out[c.Name] = p
	}
	return out, nil
}
