package describe

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
)

// printDecision writes the broker's record of r: its request, the decision,
// the reasons for it in sentences and the candidates compared.
func printDecision(out io.Writer, r api.Reservation, currency map[string]string, now time.Time) error {
	w := newTabWriter(out)
	field := func(name, value string) { row(w, name+":", value) }
	field("Reservation", r.ID)
	field("Phase", r.Phase)
	field("Requester", r.Requester)
	field("Request", describeRequest(r.Resources))
	if r.Selector != nil && len(r.Selector.MatchLabels) > 0 {
		field("Selector", output.Labels(r.Selector.MatchLabels))
	}
	if r.Owner != "" {
		field("Owner", r.Owner)
	}
	if r.Priority != 0 {
		field("Priority", strconv.Itoa(int(r.Priority)))
	}
	if r.Group != "" {
		field("Group", r.Group+" (a gang: its members were reserved together, all or nothing)")
	}
	if r.SpreadGroup != "" {
		field("Spread", r.SpreadGroup+" (placed among the other replicas of its spread group)")
	}
	if r.PreemptedBy != "" {
		field("Preempted By", r.PreemptedBy+" (of higher priority: it took this reservation's capacity)")
	}
	field("Created", output.Timestamp(r.CreatedAt)+" ("+output.Ago(now, r.CreatedAt)+" ago)")
	if r.EndedAt != nil {
		field("Ended", output.Timestamp(*r.EndedAt)+" ("+output.Ago(now, *r.EndedAt)+" ago)")
	} else {
		// One clock: the time left as the broker measured it, shown as a
		// local time, never the broker's expiresAt against this clock.
		left := time.Duration(r.RemainingMs) * time.Millisecond
		field("Expires", output.Timestamp(now.Add(left))+" ("+output.Until(now, now.Add(left))+")")
	}
	if r.Lease != "" {
		field("Lease", r.Lease+" (renewed by its requester while its pod is bound)")
	}
	field("Provider", r.Provider)
	if r.Preference != nil {
		field("Preference", describePreference(*r.Preference))
	}
	field("Score", output.Score(r.Score)+" of 100")
	field("Price", output.Money(r.Price, currency[r.Provider])+" per hour for the request")
	if err := w.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(out, "\nWhy %s:\n", r.Provider)
	for _, line := range reasons(r, currency) {
		fmt.Fprintf(out, "  %s\n", line)
	}
	if len(r.Candidates) == 0 {
		return nil
	}

	fmt.Fprintln(out, "\nCandidates (best first):")
	w = newTabWriter(out)
	row(w, "  RANK", "CLUSTER", "SCORE", "RESOURCE-SCORE", "COST-SCORE", "PRICE/H")
	for i, c := range r.Candidates {
		cells := []string{"  " + strconv.Itoa(i+1), c.Cluster, output.Score(c.Score), output.Score(c.ResourceScore), output.Score(c.CostScore),
			output.Money(c.Price, currency[c.Cluster])}
		if c.Cluster == r.Provider {
			cells = append(cells, "<- chosen")
		}
		row(w, cells...)
	}
	return w.Flush()
}

// describePreference says in one line which preference term placed a
// reservation, or that none fitted.
func describePreference(p api.PreferenceOutcome) string {
	tried := make([]string, len(p.Tried))
	for i, t := range p.Tried {
		tried[i] = strconv.Itoa(t)
	}
	if p.Term == nil {
		return "none fitting (terms tried: " + strings.Join(tried, ", ") + "): placed as without preferences"
	}
	return fmt.Sprintf("term %d (weight %d) had a fitting provider; placed among its providers (terms tried: %s)",
		*p.Term, p.Weight, strings.Join(tried, ", "))
}

// reasons explains the decision in sentences.
func reasons(r api.Reservation, currency map[string]string) []string {
	cands := r.Candidates
	if len(cands) == 0 {
		return []string{"The broker recorded no candidates for this decision."}
	}
	var out []string
	if p := r.Preference; p != nil && p.Term != nil {
		out = append(out, fmt.Sprintf("Preference term %d had a fitting provider: the candidates below are its providers only.", *p.Term))
	}
	if len(cands) == 1 {
		out = append(out, fmt.Sprintf("%s was the only candidate: the only live cluster, other than the requester"+
			" and matching its selector, with enough free capacity.", cands[0].Cluster))
	} else {
		out = append(out, fmt.Sprintf("%s has the highest score of the %d best candidates the broker compared.", r.Provider, len(cands)))
	}
	if wr, ok := inferWeights(cands); ok {
		out = append(out, fmt.Sprintf("score = %.2f x resource score + %.2f x cost score (weights inferred from the scores).", wr, 1-wr))
	} else {
		out = append(out, "score = w_res x resource score + w_cost x cost score (the broker's weights, 0.7 and 0.3 by default).")
	}
	out = append(out,
		"resource score: how much of the cluster stays free after the request, on average over the requested resources (0-100).",
		"cost score: 100 for the cheapest cluster that fits, 0 for the dearest, in between pro rata.")

	var win, runnerUp *api.Candidate
	for i := range cands {
		switch {
		case cands[i].Cluster == r.Provider && win == nil:
			win = &cands[i]
		case runnerUp == nil && cands[i].Cluster != r.Provider:
			runnerUp = &cands[i]
		}
	}
	if win == nil || runnerUp == nil {
		return out
	}
	score := output.Score
	var b strings.Builder
	if win.Score == runnerUp.Score {
		fmt.Fprintf(&b, "%s and %s tie at %s; on equal scores the broker picks the smaller cluster id.", win.Cluster, runnerUp.Cluster, score(win.Score))
	} else {
		fmt.Fprintf(&b, "%s beats %s by %s points: resource score %s vs %s, cost score %s vs %s",
			win.Cluster, runnerUp.Cluster, score(win.Score-runnerUp.Score),
			score(win.ResourceScore), score(runnerUp.ResourceScore), score(win.CostScore), score(runnerUp.CostScore))
		cw, cr := currency[win.Cluster], currency[runnerUp.Cluster]
		if d := runnerUp.Price - win.Price; d != 0 && cw == cr {
			what := "cheaper"
			if d < 0 {
				what, d = "dearer", -d
			}
			fmt.Fprintf(&b, "; it is %s per hour %s", output.Money(d, cw), what)
		}
		b.WriteString(".")
	}
	return append(out, b.String())
}

// inferWeights recovers the broker's resource weight w from score = w*rs +
// (1-w)*cs, using a candidate whose two scores differ enough for the
// rounding of the reported scores (to 0.01) not to matter.
func inferWeights(cands []api.Candidate) (float64, bool) {
	for _, c := range cands {
		if d := c.ResourceScore - c.CostScore; math.Abs(d) >= 5 {
			w := math.Round((c.Score-c.CostScore)/d*100) / 100
			if w >= 0 && w <= 1 {
				return w, true
			}
		}
	}
	return 0, false
}

func describeRequest(q api.Quantities) string {
	parts := []string{"cpu " + output.Cores(q.CPU), "memory " + output.Bytes(q.Memory)}
	if q.GPU != nil && !q.GPU.IsZero() {
		parts = append(parts, "gpu "+output.Count(q.GPU))
	}
	if q.Storage != nil && !q.Storage.IsZero() {
		parts = append(parts, "ephemeral storage "+output.Bytes(q.Storage))
	}
	return strings.Join(parts, ", ")
}
