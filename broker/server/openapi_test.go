package server_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/server"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
)

// openAPICheck validates real requests and answers of a broker against the
// OpenAPI document it serves, and remembers which routes it saw answered.
type openAPICheck struct {
	t     *testing.T
	b     *brokertest.Broker
	doc   *openapi3.T
	seen  map[string][]int // "GET /api/v2/clusters/{id}" -> statuses validated
	opts  *openapi3filter.Options
	paths map[string]string // path parameters of the next call
}

// call sends method path (a concrete path; pattern is its route) as cn,
// checks the status, and validates the request (when it succeeded) and the
// answer against the document.
func (c *openAPICheck) call(cn, method, pattern, path string, body any, want int) []byte {
	c.t.Helper()
	var raw []byte
	if body != nil {
		var err error
		raw, err = json.Marshal(body)
		require.NoError(c.t, err)
	}
	base := c.b.URL
	if cn == "" {
		base = c.b.Health // plain HTTP, no identity
	}
	req, err := http.NewRequest(method, base+path, bytes.NewReader(raw))
	require.NoError(c.t, err)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	cl := http.DefaultClient
	if cn != "" {
		cl = c.b.Client(cn)
	}
	resp, err := cl.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	var data []byte
	if resp.Header.Get("Content-Type") == "text/event-stream" {
		// A stream never ends: its first line is enough.
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		require.NoError(c.t, err)
		data = []byte(line)
	} else {
		data, err = io.ReadAll(resp.Body)
		require.NoError(c.t, err)
	}
	require.Equal(c.t, want, resp.StatusCode, "%s %s: %s", method, path, data)

	item := c.doc.Paths.Find(pattern)
	require.NotNil(c.t, item, "%s is not in the document", pattern)
	op := item.GetOperation(method)
	require.NotNil(c.t, op, "%s %s is not in the document", method, pattern)
	route := &routers.Route{Spec: c.doc, Path: pattern, PathItem: item, Method: method, Operation: op}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: c.paths, Route: route, Options: c.opts}
	if want < 300 {
		req.Body = io.NopCloser(bytes.NewReader(raw))
		assert.NoError(c.t, openapi3filter.ValidateRequest(c.t.Context(), in), "request %s %s", method, path)
	}
	opts := *c.opts
	opts.ExcludeResponseBody = resp.Header.Get("Content-Type") == "text/event-stream"
	in.Options = &opts
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Body: io.NopCloser(bytes.NewReader(data)), Options: &opts}
	assert.NoError(c.t, openapi3filter.ValidateResponse(c.t.Context(), out), "answer to %s %s: %s", method, path, data)
	key := method + " " + pattern
	c.seen[key] = append(c.seen[key], resp.StatusCode)
	c.paths = nil
	return data
}

func (c *openAPICheck) with(params ...string) *openAPICheck {
	c.paths = map[string]string{}
	for i := 0; i+1 < len(params); i += 2 {
		c.paths[params[i]] = params[i+1]
	}
	return c
}

// TestOperatorOpenAPI checks the OpenAPI document the broker serves (real
// broker, real Redis, mutual TLS): it is valid OpenAPI 3, documents exactly
// the routes the server registers, and every route's real answers, the
// errors included, validate against it, as do the requests that succeeded.
func TestOperatorOpenAPI(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	resp, err := b.Client("rome").Get(b.URL + "/openapi/v3")
	require.NoError(t, err)
	served, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.JSONEq(t, string(api.OpenAPI()), string(served))

	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(served)
	require.NoError(t, err)
	require.NoError(t, doc.Validate(t.Context()), "the document is valid OpenAPI 3")

	// Every registered route is documented, and nothing else is.
	var documented []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	assert.ElementsMatch(t, server.Routes(), documented)

	c := &openAPICheck{t: t, b: b, doc: doc, seen: map[string][]int{},
		opts: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true, AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	q := brokertest.Quantities
	ad := func(name string) api.Advertisement {
		return api.Advertisement{ClusterName: name, Endpoint: "https://" + name + ".example:6443", Labels: map[string]string{"region": "eu"},
			Resources: api.ClusterResources{Capacity: q("8", "32Gi", "1"), Allocatable: q("8", "32Gi", "1"), Allocated: q("1", "1Gi", ""),
				Nodes: []api.NodeResources{{Name: name + "-node-1", Allocatable: q("8", "32Gi", "1"), Allocated: q("1", "1Gi", "")}}},
			Prices: &api.Prices{Currency: "EUR", CPU: brokertest.MustQ("0.03"), Memory: brokertest.MustQ("0.004"), GPU: brokertest.MustQ("0.9")}}
	}

	// Clusters.
	const adv = "/api/v2/clusters/{id}/advertisement"
	c.with("id", "paris").call("paris", http.MethodPut, adv, "/api/v2/clusters/paris/advertisement", ad("paris"), http.StatusOK)
	c.with("id", "paris").call("rome", http.MethodPut, adv, "/api/v2/clusters/paris/advertisement", ad("paris"), http.StatusForbidden)
	c.with("id", "rome").call("rome", http.MethodPut, adv, "/api/v2/clusters/rome/advertisement", map[string]any{"resources": "none"}, http.StatusBadRequest)
	const hb = "/api/v2/clusters/{id}/heartbeat"
	stored := brokertest.Decode[api.Cluster](t, c.with("id", "paris").call("rome", http.MethodGet, "/api/v2/clusters/{id}", "/api/v2/clusters/paris", nil, http.StatusOK))
	c.with("id", "paris").call("paris", http.MethodPut, hb, "/api/v2/clusters/paris/heartbeat", api.HeartbeatRequest{Digest: stored.Digest}, http.StatusOK)
	c.with("id", "paris").call("paris", http.MethodPut, hb, "/api/v2/clusters/paris/heartbeat", api.HeartbeatRequest{Digest: "0123456789abcdef"}, http.StatusConflict)
	c.with("id", "paris").call("paris", http.MethodPut, hb, "/api/v2/clusters/paris/heartbeat", map[string]any{"digest": 7}, http.StatusBadRequest)
	c.with("id", "paris").call("rome", http.MethodPut, hb, "/api/v2/clusters/paris/heartbeat", api.HeartbeatRequest{Digest: stored.Digest}, http.StatusForbidden)
	c.call("rome", http.MethodGet, "/api/v2/clusters", "/api/v2/clusters?limit=10", nil, http.StatusOK)
	c.call("rome", http.MethodGet, "/api/v2/clusters", "/api/v2/clusters?continue=garbage", nil, http.StatusBadRequest)
	c.with("id", "paris").call("rome", http.MethodGet, "/api/v2/clusters/{id}", "/api/v2/clusters/paris", nil, http.StatusOK)
	c.with("id", "london").call("rome", http.MethodGet, "/api/v2/clusters/{id}", "/api/v2/clusters/london", nil, http.StatusNotFound)

	// Reservations: made, replayed, refused, read, listed, granted, renewed, released.
	r1 := api.ReservationRequest{ID: "r1", Resources: q("1", "1Gi", ""), Duration: "1h", Owner: "shop/web-0", Priority: 10,
		Selector: &api.LabelSelector{MatchLabels: map[string]string{"region": "eu"}}, Lease: "2m",
		Preferences: []api.Preference{{Weight: 80, MatchLabels: map[string]string{"tier": "gold"}}, {Weight: 20, Clusters: []string{"paris"}}}}
	const rsvs, rsv = "/api/v2/reservations", "/api/v2/reservations/{id}"
	c.call("rome", http.MethodPost, rsvs, rsvs, r1, http.StatusCreated)
	c.call("rome", http.MethodPost, rsvs, rsvs, r1, http.StatusOK)
	c.call("rome", http.MethodPost, rsvs, rsvs, reservation("big", "100", "1Gi"), http.StatusConflict)
	c.call("rome", http.MethodPost, rsvs, rsvs, map[string]any{"id": "Not An Id"}, http.StatusBadRequest)
	c.call("rome", http.MethodGet, rsvs, rsvs, nil, http.StatusOK)
	c.call("paris", http.MethodGet, rsvs, rsvs+"?role=provider&limit=1", nil, http.StatusOK)
	c.call("rome", http.MethodGet, rsvs, rsvs+"?role=owner", nil, http.StatusBadRequest)
	c.with("id", "r1").call("paris", http.MethodGet, rsv, rsvs+"/r1?requester=rome", nil, http.StatusOK)
	c.with("id", "nothing").call("rome", http.MethodGet, rsv, rsvs+"/nothing", nil, http.StatusNotFound)
	grant := api.Grant{Endpoint: "https://paris:6443", CABundle: []byte("-----BEGIN CERTIFICATE-----"), Token: "secret-token",
		Namespace: "rb-rome", ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Second),
		Placement: &api.Placement{Node: "paris-node-1", PriorityClassName: "rb-tenant"}}
	const grantRoute = "/api/v2/reservations/{id}/grant"
	c.with("id", "r1").call("paris", http.MethodPost, grantRoute, rsvs+"/r1/grant?requester=rome", grant, http.StatusOK)
	c.with("id", "r1").call("rome", http.MethodPost, grantRoute, rsvs+"/r1/grant", grant, http.StatusForbidden)
	got := brokertest.Decode[api.Reservation](t, c.with("id", "r1").call("rome", http.MethodGet, rsv, rsvs+"/r1", nil, http.StatusOK))
	require.NotNil(t, got.Grant, "the requester's view, with its grant, validated too")
	c.call("rome", http.MethodPost, "/api/v2/renewals", "/api/v2/renewals", api.RenewRequest{IDs: []string{"r1", "nothing"}}, http.StatusOK)
	c.call("rome", http.MethodPost, "/api/v2/renewals", "/api/v2/renewals", map[string]any{"ids": "r1"}, http.StatusBadRequest)
	c.call("paris", http.MethodPost, "/api/v2/renewals/quiet", "/api/v2/renewals/quiet", api.QuietRequest{Requesters: []string{"rome", "oslo"}}, http.StatusOK)
	c.call("paris", http.MethodPost, "/api/v2/renewals/quiet", "/api/v2/renewals/quiet", map[string]any{"requesters": "rome"}, http.StatusBadRequest)
	// A gang, and the protections report.
	member := func(id, cpu string) api.GroupMember { return api.GroupMember{ID: id, Resources: q(cpu, "1Gi", "")} }
	const groups, protections = "/api/v2/groups", "/api/v2/protections"
	gang := api.GroupRequest{Group: "train", MinMember: 2, Members: []api.GroupMember{member("g0", "1"), member("g1", "1")}, Duration: "1h"}
	c.call("rome", http.MethodPost, groups, groups, gang, http.StatusCreated)
	c.call("rome", http.MethodPost, groups, groups, gang, http.StatusOK)
	c.call("rome", http.MethodPost, groups, groups, api.GroupRequest{Group: "huge", MinMember: 2,
		Members: []api.GroupMember{member("h0", "100"), member("h1", "100")}}, http.StatusConflict)
	c.call("rome", http.MethodPost, groups, groups, map[string]any{"group": "empty"}, http.StatusBadRequest)
	c.call("rome", http.MethodPost, groups, groups, api.GroupRequest{Group: "preferring", MinMember: 1, Members: []api.GroupMember{member("p0", "1")},
		Preferences: []api.Preference{{Weight: 1, Clusters: []string{"paris"}}}}, http.StatusBadRequest)
	c.call("rome", http.MethodPut, protections, protections, api.ProtectRequest{IDs: []string{"g0"}}, http.StatusOK)
	c.call("rome", http.MethodPut, protections, protections, map[string]any{"ids": "g0"}, http.StatusBadRequest)
	for _, id := range []string{"g0", "g1"} {
		c.with("id", id).call("rome", http.MethodDelete, rsv, rsvs+"/"+id, nil, http.StatusOK)
	}
	c.call("rome", http.MethodGet, "/api/v2/usage", "/api/v2/usage", nil, http.StatusOK)
	c.call("rome", http.MethodGet, "/api/v2/events", "/api/v2/events", nil, http.StatusOK)
	c.call("rome", http.MethodGet, "/api/v2/events", "/api/v2/events?since=0", nil, http.StatusOK)
	c.call("rome", http.MethodGet, "/api/v2/events", "/api/v2/events?since=1700000000000-0", nil, http.StatusOK)
	c.call("rome", http.MethodGet, "/api/v2/events", "/api/v2/events?since=yesterday", nil, http.StatusBadRequest)
	const cl = "/api/v2/clusters/{id}"
	c.with("id", "paris").call("paris", http.MethodDelete, cl, "/api/v2/clusters/paris", nil, http.StatusConflict) // provides r1
	c.with("id", "r1").call("rome", http.MethodDelete, rsv, rsvs+"/r1", nil, http.StatusOK)
	c.with("id", "r1").call("paris", http.MethodPost, grantRoute, rsvs+"/r1/grant?requester=rome", grant, http.StatusConflict)
	c.with("id", "nothing").call("rome", http.MethodDelete, rsv, rsvs+"/nothing", nil, http.StatusNotFound)
	c.with("id", "paris").call("rome", http.MethodDelete, cl, "/api/v2/clusters/paris", nil, http.StatusForbidden)
	c.with("id", "london").call("london", http.MethodDelete, cl, "/api/v2/clusters/london", nil, http.StatusNotFound)
	c.with("id", "paris").call("paris", http.MethodDelete, cl, "/api/v2/clusters/paris", nil, http.StatusNoContent) // paris leaves

	// v1, as the seed agents speak it.
	v1ad := api.V1Advertisement{ClusterID: "berlin", ClusterName: "berlin", Timestamp: time.Now().UTC().Truncate(time.Second),
		Resources: api.V1Resources{Capacity: q("16", "64Gi", "4"), Allocatable: q("16", "64Gi", "4"), Allocated: q("0", "0", "")}}
	c.call("berlin", http.MethodPost, "/api/v1/advertisements", "/api/v1/advertisements", v1ad, http.StatusOK)
	c.call("rome", http.MethodPost, "/api/v1/advertisements", "/api/v1/advertisements", v1ad, http.StatusForbidden)
	c.with("clusterID", "berlin").call("rome", http.MethodGet, "/api/v1/advertisements/{clusterID}", "/api/v1/advertisements/berlin", nil, http.StatusOK)
	c.with("clusterID", "london").call("rome", http.MethodGet, "/api/v1/advertisements/{clusterID}", "/api/v1/advertisements/london", nil, http.StatusNotFound)
	c.call("rome", http.MethodPost, "/api/v1/reservations", "/api/v1/reservations",
		api.V1ReservationRequest{RequestedResources: q("12", "1Gi", ""), Duration: "1h"}, http.StatusCreated)
	c.call("rome", http.MethodPost, "/api/v1/reservations", "/api/v1/reservations",
		api.V1ReservationRequest{RequestedResources: q("1000", "1Gi", "")}, http.StatusConflict)
	instructions := c.call("berlin", http.MethodGet, "/api/v1/instructions", "/api/v1/instructions", nil, http.StatusOK)
	assert.Len(t, brokertest.Decode[[]api.V1Reservation](t, instructions), 1, "berlin provides the v1 reservation")
	c.call("berlin", http.MethodPost, "/api/v1/advertisements", "/api/v1/advertisements", v1ad, http.StatusOK) // with its instructions

	// Operations, on the health port (plain HTTP, no identity).
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/openapi/v3"} {
		c.call("", http.MethodGet, p, p, nil, http.StatusOK)
	}

	for _, r := range server.Routes() {
		assert.NotEmpty(t, c.seen[r], "no answer of %s validated", r)
	}
	var summary []string
	for r, codes := range c.seen {
		summary = append(summary, r+" "+strings.Trim(strings.ReplaceAll(fmt.Sprint(codes), " ", ","), "[]"))
	}
	slices.Sort(summary)
	t.Logf("validated answers, by route:\n%s", strings.Join(summary, "\n"))
}
