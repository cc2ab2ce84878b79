package run

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/actionbus/actionbus/internal/events"
)

func TestStepsRenderAsRecordedOrLiveProgress(t *testing.T) {
	st := &State{RunID: "01J0000000000000000000000R", Tenant: "default"}
	for _, tc := range []struct {
		step StepName
		want string
	}{
		{StepPolicyEvaluated, events.TypeRunStep},
		{StepAwaitingApproval, events.TypeRunStep},
		{StepApprovalRefused, events.TypeRunStep},
		{StepActionFailed, events.TypeRunStep},
		{StepActionArgsAliasRewrite, events.TypeRunStep},
		{StepWaitingForCapacity, events.TypeRunStep},
		{StepRetried, events.TypeRunStep},
		{StepAct, events.TypeRunProgress},
		{StepActionDispatched, events.TypeRunProgress},
		{StepActionCompleted, events.TypeRunProgress},
		{StepObserve, events.TypeRunProgress},
		{StepFinal, events.TypeRunProgress},
		{StepSynthesizeStitchDone, events.TypeRunProgress},
	} {
		t.Run(string(tc.step), func(t *testing.T) {
			em, ok := Render(st, step(st, tc.step, nil, "", "", ""))
			assert.True(t, ok)
			assert.Equal(t, tc.want, em.Type)
		})
	}
	// Every progress step is a known step.
	for name := range progressSteps {
		assert.Contains(t, StepNames, name)
	}
}
