package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestInvalidFlagsRefuseToStart(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--weight-resources=0.5"}, "must be non-negative and sum to 1"},
		{[]string{"--weight-resources=1.2", "--weight-cost=-0.2"}, "must be non-negative and sum to 1"},
		{[]string{"--stale-threshold=0s"}, "--stale-threshold must be positive"},
		{[]string{"--default-duration=48h"}, "exceeds --max-duration"},
		{[]string{"--redis-sentinel-master=mymaster"}, "go together"},
		{[]string{"--redis-url=mysql://x"}, "--redis-url"},
		{[]string{"--cert-dir=/nonexistent"}, "/nonexistent"},
		{[]string{"extra-arg"}, "unknown command"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			cmd := newCommand()
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}
