package run

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestPoolsInFlightAreThePoolsOfCallsSentAndNotAnswered(t *testing.T) {
	for _, tc := range []struct {
		name  string
		calls []CallState
		want  []string
	}{
		{"no calls", nil, nil},
		{"every call answered", []CallState{{Pool: "a", Dispatched: true, Done: true}}, nil},
		{"a call not sent yet (queued behind the plan's bound, or awaiting approval)", []CallState{{Pool: "a"}}, nil},
		{"calls in flight, each pool once, in call order", []CallState{
			{Pool: "b", Dispatched: true}, {Pool: "a", Dispatched: true, Done: true}, {Pool: "a", Dispatched: true}, {Pool: "b", Dispatched: true},
		}, []string{"b", "a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &State{Calls: tc.calls}
			assert.Equal(t, tc.want, st.PoolsInFlight())
		})
	}
}
