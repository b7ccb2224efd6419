package main

import (
	"context"
	"fmt"
	"net/http"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// viewDecisions reads a replica's rb_broker_view_decisions_total from its
// /metrics: the decisions it proposed from its view (hinted) and those that
// walked the index in Redis (walked), since it started.
func viewDecisions(ctx context.Context, health string) (hinted, walked float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, health+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, 0, fmt.Errorf("GET %s/metrics: %s", health, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return 0, 0, fmt.Errorf("GET %s/metrics: %w", health, err)
	}
	fam := fams["rb_broker_view_decisions_total"]
	if fam == nil {
		return 0, 0, nil // none yet
	}
	for _, m := range fam.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() != "how" {
				continue
			}
			switch l.GetValue() {
			case "hinted":
				hinted = m.GetCounter().GetValue()
			case "walked":
				walked = m.GetCounter().GetValue()
			}
		}
	}
	return hinted, walked, nil
}
