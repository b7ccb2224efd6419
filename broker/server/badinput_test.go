package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// TestBadInputChangesNothing sends malformed and invalid requests to every
// writing route: each gets a 4xx with a JSON message, and Redis is untouched.
func TestBadInputChangesNothing(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{Limits: api.Limits{DefaultDuration: time.Hour, MaxDuration: 24 * time.Hour}})
	b.Advertise("paris", "8", "32Gi", "2", "0.03", nil)
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations", reservationLease("existing", "1", "1Gi", "1m"))
	require.Equal(t, http.StatusCreated, code, "%s", data)
	before := b.Snapshot()

	resv := func(extra string) string {
		return `{"id":"bad-1","resources":{"cpu":"1","memory":"1Gi"}` + extra + `}`
	}
	adv := func(alloc, extra string) string {
		return `{"resources":{"capacity":{"cpu":"8","memory":"32Gi"},"allocatable":` + alloc +
			`,"allocated":{"cpu":"0","memory":"0"}}` + extra + `}`
	}
	v1adv := func(alloc, extra string) string {
		return `{"clusterID":"paris","clusterName":"paris","resources":{"capacity":{"cpu":"8","memory":"32Gi"},"allocatable":` + alloc +
			`,"allocated":{"cpu":"0","memory":"0"},"available":{"cpu":"8","memory":"32Gi"}},"timestamp":"2026-11-22T10:00:00Z"` + extra + `}`
	}
	const okAlloc = `{"cpu":"8","memory":"32Gi"}`
	advNodes := func(nodes, ids string) string { // nodes and ids inside "resources"
		base := adv(okAlloc, "")
		return base[:len(base)-2] + `,"nodes":[` + nodes + `],"reservationsOnNodes":[` + ids + `]}}`
	}
	const v2r, v2a, v1r, v1a = "/api/v2/reservations", "/api/v2/clusters/paris/advertisement", "/api/v1/reservations", "/api/v1/advertisements"
	const v2n = "/api/v2/renewals"
	cases := []struct {
		name, cn, method, path, body string
		want                         int
	}{
		{"malformed JSON", "rome", "POST", v2r, `{"id":`, 400},
		{"empty body", "rome", "POST", v2r, ``, 400},
		{"not an object", "rome", "POST", v2r, `[1,2]`, 400},
		{"trailing data", "rome", "POST", v2r, resv("") + `{}`, 400},
		{"unknown field", "rome", "POST", v2r, resv(`,"bogus":1`), 400},
		{"negative cpu", "rome", "POST", v2r, `{"id":"bad-1","resources":{"cpu":"-1","memory":"1Gi"}}`, 400},
		{"unparseable quantity", "rome", "POST", v2r, `{"id":"bad-1","resources":{"cpu":"lots","memory":"1Gi"}}`, 400},
		{"quantity as a boolean", "rome", "POST", v2r, `{"id":"bad-1","resources":{"cpu":true,"memory":"1Gi"}}`, 400},
		{"huge quantity", "rome", "POST", v2r, `{"id":"bad-1","resources":{"cpu":"1e30","memory":"1Gi"}}`, 400},
		{"zero cpu", "rome", "POST", v2r, `{"id":"bad-1","resources":{"cpu":"0","memory":"1Gi"}}`, 400},
		{"missing memory", "rome", "POST", v2r, `{"id":"bad-1","resources":{"cpu":"1"}}`, 400},
		{"half a GPU", "rome", "POST", v2r, `{"id":"bad-1","resources":{"cpu":"1","memory":"1Gi","gpu":"500m"}}`, 400},
		{"invalid duration", "rome", "POST", v2r, resv(`,"duration":"forever"`), 400},
		{"negative duration", "rome", "POST", v2r, resv(`,"duration":"-1h"`), 400},
		{"duration over the maximum", "rome", "POST", v2r, resv(`,"duration":"48h"`), 400},
		{"invalid lease", "rome", "POST", v2r, resv(`,"lease":"a while"`), 400},
		{"lease under a second", "rome", "POST", v2r, resv(`,"lease":"500ms"`), 400},
		{"negative lease", "rome", "POST", v2r, resv(`,"lease":"-2m"`), 400},
		{"lease over the maximum", "rome", "POST", v2r, resv(`,"lease":"25h"`), 400},
		{"renewal malformed JSON", "rome", "POST", v2n, `{"ids":[`, 400},
		{"renewal empty body", "rome", "POST", v2n, ``, 400},
		{"renewal ids not a list", "rome", "POST", v2n, `{"ids":"existing"}`, 400},
		{"renewal unknown field", "rome", "POST", v2n, `{"ids":["existing"],"lease":"1h"}`, 400},
		{"renewal bad id", "rome", "POST", v2n, `{"ids":["existing","Not_An_Id"]}`, 400},
		{"renewal empty id", "rome", "POST", v2n, `{"ids":[""]}`, 400},
		{"renewal too many ids", "rome", "POST", v2n, renewJSON(api.MaxRenewBatch + 1), 400},
		{"renewal huge body", "rome", "POST", v2n, `{"ids":["` + strings.Repeat("a", api.MaxRenewBodyBytes) + `"]}`, 413},
		{"grant bad requester", "paris", "POST", "/api/v2/reservations/existing/grant?requester=Not_A_Cluster",
			`{"endpoint":"https://x","token":"t","namespace":"rb-rome","expiresAt":"2030-01-01T00:00:00Z"}`, 400},
		{"release bad requester", "paris", "DELETE", "/api/v2/reservations/existing?requester=a/b", ``, 400},
		{"missing id", "rome", "POST", v2r, `{"resources":{"cpu":"1","memory":"1Gi"}}`, 400},
		{"non-DNS id", "rome", "POST", v2r, `{"id":"Not_A_Name","resources":{"cpu":"1","memory":"1Gi"}}`, 400},
		{"id too long", "rome", "POST", v2r, `{"id":"` + strings.Repeat("a", 300) + `","resources":{"cpu":"1","memory":"1Gi"}}`, 400},
		{"bad selector key", "rome", "POST", v2r, resv(`,"selector":{"matchLabels":{"bad key!":"x"}}`), 400},
		{"selector expressions unsupported", "rome", "POST", v2r, resv(`,"selector":{"matchExpressions":[]}`), 400},
		{"huge body", "rome", "POST", v2r, resv(`,"owner":"` + strings.Repeat("x", api.MaxBodyBytes) + `"`), 413},
		{"advertise negative allocatable", "paris", "PUT", v2a, adv(`{"cpu":"-8","memory":"32Gi"}`, ""), 400},
		{"advertise unparseable", "paris", "PUT", v2a, adv(`{"cpu":"eight","memory":"32Gi"}`, ""), 400},
		{"advertise unknown field", "paris", "PUT", v2a, adv(okAlloc, `,"reserved_cpu":"0"`), 400},
		{"advertise negative price", "paris", "PUT", v2a, adv(okAlloc, `,"prices":{"cpu":"-1"}`), 400},
		{"advertise bad currency", "paris", "PUT", v2a, adv(okAlloc, `,"prices":{"currency":"euro"}`), 400},
		{"advertise plain-http endpoint", "paris", "PUT", v2a, adv(okAlloc, `,"endpoint":"http://paris:6443"`), 400},
		{"advertise bad label", "paris", "PUT", v2a, adv(okAlloc, `,"labels":{"region":"not valid!"}`), 400},
		{"advertise malformed", "paris", "PUT", v2a, `{"resources":`, 400},
		{"advertise too many nodes", "paris", "PUT", v2a, advNodes(nodesJSON(api.MaxNodes+1), ""), 400},
		{"advertise node without name", "paris", "PUT", v2a, advNodes(`{"allocatable":{"cpu":"1"},"allocated":{}}`, ""), 400},
		{"advertise node name not a DNS subdomain", "paris", "PUT", v2a, advNodes(nodeJSON("Node_1", "4", "1"), ""), 400},
		{"advertise node name with a space", "paris", "PUT", v2a, advNodes(nodeJSON("n 1", "4", "1"), ""), 400},
		{"advertise node twice", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "4", "1")+","+nodeJSON("n1", "4", "1"), ""), 400},
		{"advertise node negative", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "4", "-1"), ""), 400},
		{"advertise node unparseable", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "four", "1"), ""), 400},
		{"advertise node allocated over allocatable", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "4", "5"), ""), 400},
		{"advertise node half a GPU", "paris", "PUT", v2a, advNodes(`{"name":"n1","allocatable":{"cpu":"4","gpu":"500m"},"allocated":{}}`, ""), 400},
		{"advertise node unknown field", "paris", "PUT", v2a, advNodes(`{"name":"n1","allocatable":{"cpu":"4"},"allocated":{},"pods":3}`, ""), 400},
		{"advertise listed id not a DNS subdomain", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "4", "1"), `"rome/Bad_Id"`), 400},
		{"advertise listed id without its requester", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "4", "1"), `"existing"`), 400},
		{"advertise listed id with a bad requester", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "4", "1"), `"Rome.x/existing"`), 400},
		{"advertise listed id with an empty id", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "4", "1"), `"rome/"`), 400},
		{"advertise too many listed ids", "paris", "PUT", v2a, advNodes(nodeJSON("n1", "4", "1"), idsJSON(api.MaxReservationsOnNodes+1)), 400},
		{"grant invalid endpoint", "paris", "POST", "/api/v2/reservations/existing/grant",
			`{"endpoint":"ftp://x","token":"t","namespace":"rb-rome","expiresAt":"2030-01-01T00:00:00Z"}`, 400},
		{"grant missing token", "paris", "POST", "/api/v2/reservations/existing/grant",
			`{"endpoint":"https://x","namespace":"rb-rome","expiresAt":"2030-01-01T00:00:00Z"}`, 400},
		{"grant unknown reservation", "paris", "POST", "/api/v2/reservations/nope/grant",
			`{"endpoint":"https://x","token":"t","namespace":"rb-rome","expiresAt":"2030-01-01T00:00:00Z"}`, 404},
		{"v1 reservation missing cpu", "rome", "POST", v1r, `{"requestedResources":{"memory":"1Gi"}}`, 400},
		{"v1 reservation zero memory", "rome", "POST", v1r, `{"requestedResources":{"cpu":"1","memory":"0"}}`, 400},
		{"v1 reservation invalid duration", "rome", "POST", v1r, `{"requestedResources":{"cpu":"1","memory":"1Gi"},"duration":"1 hour"}`, 400},
		{"v1 reservation negative", "rome", "POST", v1r, `{"requestedResources":{"cpu":"1","memory":"-1Gi"}}`, 400},
		{"v1 reservation malformed", "rome", "POST", v1r, `{"requestedResources":`, 400},
		{"v1 advertisement malformed quantity", "paris", "POST", v1a, v1adv(`{"cpu":"8 cores","memory":"32Gi"}`, ""), 400},
		{"v1 advertisement negative", "paris", "POST", v1a, v1adv(`{"cpu":"8","memory":"-32Gi"}`, ""), 400},
		{"v1 advertisement bad timestamp", "paris", "POST", v1a, strings.Replace(v1adv(okAlloc, ""), "2026-11-22T10:00:00Z", "yesterday", 1), 400},
		{"v1 advertisement unknown field", "paris", "POST", v1a, v1adv(okAlloc, `,"extra":true`), 400},
		{"release unknown", "rome", "DELETE", "/api/v2/reservations/nope", ``, 404},
		{"unknown route", "rome", "POST", "/api/v3/reservations", resv(""), 404},
		{"bad role", "rome", "GET", "/api/v2/reservations?role=admin", ``, 400},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, data := b.Do(tc.cn, tc.method, tc.path, tc.body)
			assert.Equal(t, tc.want, code, "%s", data)
			var e api.Error
			require.NoError(t, json.Unmarshal(data, &e), "errors are JSON: %s", data)
			assert.NotEmpty(t, e.Error, "a message says what is wrong")
			assert.NotEmpty(t, e.Reason)
		})
	}
	assert.Equal(t, before, b.Snapshot(), "no refused request changed Redis")
}

// nodeJSON is one advertised node of the wire.
func nodeJSON(name, allocatableCPU, allocatedCPU string) string {
	return fmt.Sprintf(`{"name":%q,"allocatable":{"cpu":%q,"memory":"8Gi"},"allocated":{"cpu":%q,"memory":"1Gi"}}`,
		name, allocatableCPU, allocatedCPU)
}

func nodesJSON(n int) string {
	out := make([]string, n)
	for i := range out {
		out[i] = nodeJSON(fmt.Sprintf("n%d", i), "4", "1")
	}
	return strings.Join(out, ",")
}

// renewJSON is a renewal of n ids (existing first, so that a valid batch would renew it).
func renewJSON(n int) string {
	ids := make([]string, n)
	ids[0] = `"existing"`
	for i := 1; i < n; i++ {
		ids[i] = fmt.Sprintf(`"r%d"`, i)
	}
	return `{"ids":[` + strings.Join(ids, ",") + `]}`
}

func idsJSON(n int) string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf(`"rome/r%d"`, i)
	}
	return strings.Join(out, ",")
}
