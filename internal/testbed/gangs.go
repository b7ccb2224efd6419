package testbed

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// podGroupCRDDir is the directory of scheduler-plugins' generated CRDs
// (PodGroup, ElasticQuota) in the module cache: the version go.mod pins,
// the one rb-scheduler's Coscheduling is built from.
func podGroupCRDDir(moduleRoot string) (string, error) {
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/scheduler-plugins")
	cmd.Dir = moduleRoot
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("locate sigs.k8s.io/scheduler-plugins (go mod download): %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases")
	if _, err := os.Stat(filepath.Join(dir, "scheduling.x-k8s.io_podgroups.yaml")); err != nil {
		return "", fmt.Errorf("scheduler-plugins' PodGroup CRD: %w", err)
	}
	return dir, nil
}

// enableCoscheduling adds Coscheduling to the resource-broker profile at
// the points that make a gang bind together: PreFilter (a member waits for
// its siblings to exist), Permit (members wait there until minMember are
// placed) and Reserve (Unreserve releases the waiting siblings). Not its
// QueueSort (every profile of one scheduler must share one, and the
// default-scheduler profile keeps PrioritySort) nor its PostFilter, which
// rejects the waiting members whenever one member's attempt fails: a member
// whose reservation is not usable yet fails an attempt while its siblings
// wait, and those would be sent back for nothing.
func enableCoscheduling(profiles []any) error {
	for _, p := range profiles {
		prof, _ := p.(map[string]any)
		if prof["schedulerName"] != "resource-broker" {
			continue
		}
		plugins, _ := prof["plugins"].(map[string]any)
		if plugins == nil {
			plugins = map[string]any{}
			prof["plugins"] = plugins
		}
		for _, point := range []string{"preFilter", "permit", "reserve"} {
			ep, _ := plugins[point].(map[string]any)
			if ep == nil {
				ep = map[string]any{}
				plugins[point] = ep
			}
			enabled, _ := ep["enabled"].([]any)
			ep["enabled"] = append(enabled, map[string]any{"name": "Coscheduling"})
		}
		pc, _ := prof["pluginConfig"].([]any)
		prof["pluginConfig"] = append(pc, map[string]any{"name": "Coscheduling",
			"args": map[string]any{"permitWaitingTimeSeconds": 120}})
		return nil
	}
	return fmt.Errorf("no resource-broker profile in manifests/scheduler")
}
