package main

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	brokerclient "github.com/fluidos-project/resource-broker/broker/client"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	assert.Equal(t, 50*time.Millisecond, percentile(d, 50))
	assert.Equal(t, 99*time.Millisecond, percentile(d, 99))
	assert.Equal(t, 100*time.Millisecond, percentile(d, 100))
	assert.Equal(t, time.Millisecond, percentile(d, 0))
	assert.Equal(t, 7*time.Millisecond, percentile([]time.Duration{7 * time.Millisecond}, 99))
	assert.Zero(t, percentile(nil, 50))
}

func TestDueTicks(t *testing.T) {
	assert.Equal(t, int64(500), dueTicks(time.Second, 500, 0))
	assert.Equal(t, int64(5), dueTicks(time.Second+10*time.Millisecond, 500, 500), "a tick 10 ms later owes 5 at 500/s")
	assert.Equal(t, int64(25), dueTicks(60*time.Millisecond, 500, 5), "a late tick owes what it missed")
	assert.Zero(t, dueTicks(time.Second, 500, 600), "never negative")
}

func TestPhaseSpreadsMembersOverThePeriod(t *testing.T) {
	p := 30 * time.Second
	assert.Zero(t, phase(0, 1000, p))
	assert.Equal(t, 15*time.Second, phase(500, 1000, p))
	assert.Equal(t, 29970*time.Millisecond, phase(999, 1000, p))
	assert.Zero(t, phase(3, 0, p))
}

func TestBatchesOfAtMostTheRenewersSize(t *testing.T) {
	ids := make([]string, 12_001)
	for i := range ids {
		ids[i] = fmt.Sprint(i)
	}
	b := batches(ids, renewBatch)
	assert.Len(t, b, 3)
	assert.Len(t, b[0], 5000)
	assert.Len(t, b[2], 2001)
	assert.Equal(t, "12000", b[2][2000])
	assert.Empty(t, batches(nil, renewBatch))
}

func TestRecorderSummary(t *testing.T) {
	r := newRecorder()
	for i := 1; i <= 10; i++ {
		r.observe("reserve", time.Duration(i)*time.Millisecond, nil)
	}
	r.observe("reserve", 20*time.Millisecond, &brokerclient.APIError{StatusCode: 503, Reason: "NoCapacity"})
	r.observe("renew", time.Millisecond, errors.New("boom"))
	r.count("lost", "renewal refused: Ended")
	s := r.summary(2*time.Second, activityOrder)
	assert.Equal(t, []string{"reserve", "renew", "lost"}, []string{s[0].Name, s[1].Name, s[2].Name})
	assert.Equal(t, 11, s[0].Count)
	assert.Equal(t, 5.5, s[0].PerSec)
	assert.Equal(t, 6.0, s[0].P50Ms)
	assert.Equal(t, 20.0, s[0].P99Ms)
	assert.Equal(t, map[string]int{"503 NoCapacity": 1}, s[0].Errors)
	assert.Equal(t, map[string]int{"other": 1}, s[1].Errors)
	assert.Equal(t, map[string]int{"renewal refused: Ended": 1}, s[2].Errors)
}

func TestCommandStats(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=2500,usec_per_call=250.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_get:calls=100,usec=100,usec_per_call=1.00,rejected_calls=0,failed_calls=0\r\n"
	got := commandStats(info)
	assert.Equal(t, []CommandStats{{"evalsha", 10, 2500, 250}, {"get", 100, 100, 1}}, got)
	v, ok := infoField("# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.25\r\n", "used_cpu_user")
	assert.True(t, ok)
	assert.Equal(t, "2.25", v)
}
