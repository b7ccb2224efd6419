package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/yaml"

	"github.com/fluidos-project/resource-broker/broker/api"
	"github.com/fluidos-project/resource-broker/broker/store"
	"github.com/fluidos-project/resource-broker/internal/brokertest"
	"github.com/fluidos-project/resource-broker/internal/rbctl/output"
)

// brokerArgs are the flags that point rbctl at b as cluster id.
func brokerArgs(b *brokertest.Broker, id string, args ...string) []string {
	return append([]string{"--broker-url", b.URL, "--cert-dir", b.ClusterCertDir(id)}, args...)
}

// assertRow checks that out has a line matching pattern (whole line).
func assertRow(t *testing.T, out, pattern string) {
	t.Helper()
	re := regexp.MustCompile(`(?m)^` + pattern + `$`)
	assert.Regexp(t, re, out)
}

func reserve(t *testing.T, b *brokertest.Broker, requester, id, cpu, memory string) api.Reservation {
	t.Helper()
	code, data := b.Do(requester, http.MethodPost, "/api/v2/reservations",
		api.ReservationRequest{ID: id, Resources: brokertest.Quantities(cpu, memory, "")})
	require.Equal(t, http.StatusCreated, code, "%s", data)
	return brokertest.Decode[api.Reservation](t, data)
}

func TestGetClusters(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{Store: store.Config{StaleThreshold: 1500 * time.Millisecond}})
	b.Advertise("oslo", "4", "8Gi", "", "0.02", nil)
	time.Sleep(1600 * time.Millisecond) // oslo goes stale
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	b.Advertise("berlin", "8", "32Gi", "2", "0.05", nil)
	reserve(t, b, "rome", "r1", "2", "4Gi")

	out, err := runRbctl(t, brokerArgs(b, "rome", "get", "clusters")...)
	require.NoError(t, err, out)
	t.Logf("\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 4, out)
	assertRow(t, lines[0], `NAME +LIVE +CPU\(FREE/ALLOC\) +MEMORY\(FREE/ALLOC\) +GPU +PRICE/CORE-H +LAST-SEEN`)
	assertRow(t, lines[1], `berlin +yes +8/8 +32Gi/32Gi +2/2 +0\.05 EUR +\d+s`)
	assertRow(t, lines[2], `oslo +no +4/4 +8Gi/8Gi +- +0\.02 EUR +\d+s`)
	assertRow(t, lines[3], `paris +yes +14/16 +60Gi/64Gi +- +0\.03 EUR +\d+s`)

	out, err = runRbctl(t, brokerArgs(b, "rome", "get", "clusters", "-o", "json")...)
	require.NoError(t, err, out)
	clusters := decodeList[api.Cluster](t, out)
	require.Len(t, clusters, 3)
	assert.Equal(t, "berlin", clusters[0].ClusterID)
	assert.Equal(t, "14", clusters[2].Resources.Available.CPU.String())

	out, err = runRbctl(t, brokerArgs(b, "rome", "get", "clusters", "-o", "yaml")...)
	require.NoError(t, err, out)
	var doc struct{ Items []api.Cluster }
	require.NoError(t, yaml.Unmarshal([]byte(out), &doc), out)
	require.Len(t, doc.Items, 3)
	assert.Contains(t, out, "clusterID: paris")

	_, err = runRbctl(t, brokerArgs(b, "rome", "get", "clusters", "-o", "xml")...)
	assert.ErrorContains(t, err, "must be wide, name, json, yaml or jsonpath=<template>")
}

func TestGetReservations(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	b.Advertise("berlin", "16", "64Gi", "", "0.05", nil)
	r1 := reserve(t, b, "rome", "r1", "2", "4Gi")
	code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations",
		api.ReservationRequest{ID: "pod-1", Resources: brokertest.Quantities("1", "1Gi", ""), Lease: "2m", Duration: "90s"})
	require.Equal(t, http.StatusCreated, code, "%s", data)
	reserve(t, b, "paris", "r2", "500m", "1536Mi") // paris as requester, on berlin

	out, err := runRbctl(t, brokerArgs(b, "rome", "get", "reservations")...)
	require.NoError(t, err, out)
	t.Logf("\n%s", out)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 3, out)
	assertRow(t, lines[0], `NAME +PHASE +REQUESTER +PROVIDER +CPU +MEMORY +SCORE +REMAINING`)
	assertRow(t, out, `r1 +Reserved +rome +paris +2 +4Gi +`+regexp.QuoteMeta(output.Score(r1.Score))+` +(59|60)m`)
	assertRow(t, out, `pod-1 +Reserved +rome +paris +1 +1Gi +\d+\.\d\d +(89|90)s`)

	// paris provides r1 and requested r2.
	out, err = runRbctl(t, brokerArgs(b, "paris", "get", "reservations")...)
	require.NoError(t, err, out)
	assertRow(t, out, `r1 +Reserved +rome +paris +2 +4Gi +\d+\.\d\d +\d+m`)
	assertRow(t, out, `r2 +Reserved +paris +berlin +0\.5 +1\.5Gi +\d+\.\d\d +\d+m`)
	out, err = runRbctl(t, brokerArgs(b, "paris", "get", "reservations", "--role", "provider")...)
	require.NoError(t, err, out)
	assert.Contains(t, out, "r1 ")
	assert.NotContains(t, out, "r2 ")

	out, err = runRbctl(t, brokerArgs(b, "rome", "get", "reservations", "--role", "requester", "-o", "json")...)
	require.NoError(t, err, out)
	require.Len(t, decodeList[api.Reservation](t, out), 2)

	_, err = runRbctl(t, brokerArgs(b, "rome", "get", "reservations", "--role", "owner")...)
	assert.ErrorContains(t, err, "must be requester or provider")

	for _, id := range []string{"r1", "pod-1"} {
		code, data = b.Do("rome", http.MethodDelete, "/api/v2/reservations/"+id, nil)
		require.Equal(t, http.StatusOK, code, "%s", data)
	}
	out, err = runRbctl(t, brokerArgs(b, "rome", "get", "reservations")...)
	require.NoError(t, err, out)
	assert.Equal(t, "No reservations found.\n", out, "once both are released")
}

func TestDescribeReservation(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	b.Advertise("berlin", "16", "64Gi", "", "0.05", nil)
	b.Advertise("madrid", "4", "8Gi", "", "0.01", nil)
	r := reserve(t, b, "rome", "r1", "2", "4Gi")
	require.Equal(t, "paris", r.Provider)

	out, err := runRbctl(t, brokerArgs(b, "rome", "describe", "reservation", "r1")...)
	require.NoError(t, err, out)
	t.Logf("\n%s", out)
	assertRow(t, out, `Reservation: +r1`)
	assertRow(t, out, `Phase: +Reserved`)
	assertRow(t, out, `Requester: +rome`)
	assertRow(t, out, `Request: +cpu 2, memory 4Gi`)
	assertRow(t, out, `Provider: +paris`)
	assertRow(t, out, `Score: +`+regexp.QuoteMeta(output.Score(r.Score))+` of 100`)
	assertRow(t, out, `Price: +`+regexp.QuoteMeta(output.Money(r.Price, "EUR"))+` per hour for the request`)
	assertRow(t, out, `Expires: +\S+ \(in (59|60)m\)`)
	assert.Contains(t, out, "paris has the highest score of the 3 best candidates")
	assert.Contains(t, out, "score = 0.70 x resource score + 0.30 x cost score")
	assert.Regexp(t, `paris beats madrid by \d+\.\d\d points: resource score \d+\.\d\d vs \d+\.\d\d, `+
		`cost score \d+\.\d\d vs 100\.00; it is 0\.04 EUR per hour dearer\.`, out)
	assertRow(t, out, ` +RANK +CLUSTER +SCORE +RESOURCE-SCORE +COST-SCORE +PRICE/H`)
	c := r.Candidates
	require.Len(t, c, 3)
	for i, cand := range c {
		pattern := ` +` + []string{"1", "2", "3"}[i] + ` +` + cand.Cluster + ` +` + regexp.QuoteMeta(output.Score(cand.Score)) +
			` +` + regexp.QuoteMeta(output.Score(cand.ResourceScore)) + ` +` + regexp.QuoteMeta(output.Score(cand.CostScore)) +
			` +` + regexp.QuoteMeta(output.Money(cand.Price, "EUR"))
		if i == 0 {
			pattern += ` +<- chosen`
		}
		assertRow(t, out, pattern)
	}

	// The provider may describe it too (by the broker's id), and get it as JSON.
	out, err = runRbctl(t, brokerArgs(b, "paris", "describe", "reservation", "r1", "--role", "provider")...)
	require.NoError(t, err, out)
	assertRow(t, out, `Provider: +paris`)
	out, err = runRbctl(t, brokerArgs(b, "paris", "get", "reservation", "r1", "--role", "provider", "-o", "json")...)
	require.NoError(t, err, out)
	got := brokertest.Decode[api.Reservation](t, []byte(out))
	assert.Equal(t, r.Candidates, got.Candidates)

	_, err = runRbctl(t, brokerArgs(b, "berlin", "describe", "reservation", "r1", "--role", "provider")...)
	assert.ErrorContains(t, err, `reservation "r1" not found at the broker`, "not a party: as if it did not exist")
	_, err = runRbctl(t, brokerArgs(b, "paris", "describe", "reservation", "r1")...)
	assert.ErrorContains(t, err, `reservation "r1" not found at the broker`, "ids are scoped per requester: paris has no r1")
	_, err = runRbctl(t, brokerArgs(b, "rome", "describe", "reservation", "nope")...)
	assert.ErrorContains(t, err, `reservation "nope" not found at the broker`)
	_, err = runRbctl(t, brokerArgs(b, "rome", "describe", "reservation")...)
	assert.Error(t, err, "the reservation id is required")
}

func TestBrokerFlagsFromEnvironment(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	t.Setenv("RB_BROKER_URL", b.URL)
	t.Setenv("RB_CERT_DIR", b.ClusterCertDir("rome"))
	out, err := runRbctl(t, "get", "clusters")
	require.NoError(t, err, out)
	assertRow(t, out, `paris +yes +16/16 +64Gi/64Gi +- +0\.03 EUR +\d+s`)

	t.Setenv("RB_CERT_DIR", filepath.Join(t.TempDir(), "missing"))
	_, err = runRbctl(t, "get", "clusters")
	assert.ErrorContains(t, err, "--cert-dir must hold tls.crt, tls.key and ca.crt")
}

// TestGetReservationsPages: rbctl lists more reservations than the
// broker answers in one page (api.DefaultPageSize): all of them, each once.
func TestGetReservationsPages(t *testing.T) {
	const n = 2*api.DefaultPageSize + 1
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "10000", "10000Gi", "", "0.03", nil)
	var g errgroup.Group
	g.SetLimit(8)
	for i := range n {
		g.Go(func() error {
			code, data := b.Do("rome", http.MethodPost, "/api/v2/reservations",
				api.ReservationRequest{ID: fmt.Sprintf("r%d", i), Resources: brokertest.Quantities("10m", "10Mi", "")})
			if code != http.StatusCreated {
				return fmt.Errorf("reserve r%d: %d %s", i, code, data)
			}
			return nil
		})
	}
	require.NoError(t, g.Wait())
	out, err := runRbctl(t, brokerArgs(b, "rome", "get", "reservations", "--role", "requester", "-o", "json")...)
	require.NoError(t, err)
	list := decodeList[api.Reservation](t, out)
	ids := map[string]bool{}
	for _, r := range list {
		ids[r.ID] = true
	}
	assert.Len(t, list, n)
	assert.Len(t, ids, n, "each once")
}

// decodeList reads the items of a List as rbctl get -o json prints it.
func decodeList[T any](t *testing.T, out string) []T {
	t.Helper()
	var doc struct {
		Kind  string
		Items []T
	}
	require.NoError(t, json.Unmarshal([]byte(out), &doc), out)
	require.Equal(t, "List", doc.Kind, out)
	return doc.Items
}

// TestDeprecatedCommands: rbctl clusters, reservations and explain still
// work, and say what replaces them.
func TestDeprecatedCommands(t *testing.T) {
	b := brokertest.Start(t, brokertest.Options{})
	b.Advertise("paris", "16", "64Gi", "", "0.03", nil)
	reserve(t, b, "rome", "r1", "2", "4Gi")
	for args, want := range map[string]string{
		"clusters":     `paris +yes +14/16 +60Gi/64Gi +- +0\.03 EUR +\d+s`,
		"reservations": `r1 +Reserved +rome +paris +2 +4Gi +\d+\.\d\d +(59|60)m`,
		"explain r1":   `Provider: +paris`,
	} {
		out, err := runRbctl(t, brokerArgs(b, "rome", strings.Fields(args)...)...)
		require.NoError(t, err, out)
		command := strings.Fields(args)[0]
		assert.Contains(t, out, "Command \""+command+"\" is deprecated, use rbctl ", args)
		assertRow(t, out, want)
	}
	out, err := runRbctl(t, "--help")
	require.NoError(t, err)
	assert.NotContains(t, out, "explain", "hidden from the help")
}
