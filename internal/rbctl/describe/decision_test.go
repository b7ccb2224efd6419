package describe

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/fluidos-project/resource-broker/broker/api"
)

func TestReasons(t *testing.T) {
	eur := map[string]string{"paris": "EUR", "berlin": "EUR"}
	only := reasons(api.Reservation{Provider: "paris", Candidates: []api.Candidate{{Cluster: "paris", Score: 90, ResourceScore: 85.71, CostScore: 100}}}, eur)
	assert.Contains(t, only[0], "paris was the only candidate")
	assert.Contains(t, only[1], "score = 0.70 x resource score + 0.30 x cost score")

	tie := reasons(api.Reservation{Provider: "berlin", Candidates: []api.Candidate{
		{Cluster: "berlin", Score: 100, ResourceScore: 100, CostScore: 100, Price: 1000},
		{Cluster: "paris", Score: 100, ResourceScore: 100, CostScore: 100, Price: 1000},
	}}, eur)
	assert.Contains(t, tie[len(tie)-1], "berlin and paris tie at 100.00; on equal scores the broker picks the smaller cluster id.")
	assert.Contains(t, tie[1], "the broker's weights", "equal sub-scores tell nothing about the weights")

	cheaper := reasons(api.Reservation{Provider: "paris", Candidates: []api.Candidate{
		{Cluster: "paris", Score: 100, ResourceScore: 100, CostScore: 100, Price: 60000},
		{Cluster: "berlin", Score: 70, ResourceScore: 100, CostScore: 0, Price: 100000},
	}}, eur)
	assert.Equal(t, "paris beats berlin by 30.00 points: resource score 100.00 vs 100.00, cost score 100.00 vs 0.00;"+
		" it is 0.04 EUR per hour cheaper.", cheaper[len(cheaper)-1])

	none := reasons(api.Reservation{Provider: "paris"}, eur)
	assert.Equal(t, []string{"The broker recorded no candidates for this decision."}, none)
}

func TestDescribePreference(t *testing.T) {
	term := 1
	assert.Equal(t, "term 1 (weight 50) had a fitting provider; placed among its providers (terms tried: 0, 1)",
		describePreference(api.PreferenceOutcome{Term: &term, Weight: 50, Tried: []int{0, 1}}))
	assert.Equal(t, "none fitting (terms tried: 2, 0, 1): placed as without preferences",
		describePreference(api.PreferenceOutcome{NoneFitting: true, Tried: []int{2, 0, 1}}))
}
