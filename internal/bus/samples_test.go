package bus_test

import (
	"time"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
)

const sampleRun = "01JDQ2Z7W4M3T2V9K8F6H5G4C3"

func intp(i int) *int { return &i }

// samples holds one valid data value per catalog type; TestSamplesCoverCatalog
// fails when a type is added without one.
var samples = map[string]any{
	events.TypeRunRequested: &events.RunRequested{RunID: sampleRun, Prompt: "retry failed jobs — 100 € “now”", Scenario: "demo",
		UserID: "operator_1", AllowedModes: []string{"read", "dryRun"}, Metadata: map[string]any{"tenant": "acme", "n": 3.0}, DeadlineMs: 60000},
	events.TypeRunStarted: &events.RunStarted{RunID: sampleRun, Kind: "agent", Scenario: "demo"},
	events.TypeRunStep:    &events.RunStep{RunID: sampleRun, Name: "plan-executing", Cycle: 1, PlanIndex: intp(2), Action: "delivery.searchJobs", Status: "ok"},
	events.TypeRunProgress: &events.RunProgress{Version: events.ProgressVersion, RunID: sampleRun, Steps: []events.RunStep{
		{RunID: sampleRun, Name: "act", Cycle: 1, Message: "2 call(s)"},
		{RunID: sampleRun, Name: "action-dispatched", Cycle: 1, PlanIndex: intp(2), Action: "delivery.searchJobs"}}},
	events.TypeRunCompleted: &events.RunCompleted{RunID: sampleRun, Answer: "done", Output: map[string]any{"jobIds": []any{"job_1"}},
		Citations: []string{"https://example.com"}, Cycles: 3},
	events.TypeRunFailed: &events.RunFailed{RunID: sampleRun, Error: actionbus.Error{Code: actionbus.CodeActionNotFound, Message: "no such action",
		Details: map[string]any{"action": "nope"}}, Cycles: 1},
	events.TypeRunCanceled:     &events.RunCanceled{RunID: sampleRun, Reason: "operator", Cycles: 2},
	events.TypeCancelRequested: &events.CancelRequested{RunID: sampleRun, Reason: "operator", RequestedBy: "ops"},
	events.TypeDecisionRequested: &events.DecisionRequested{RunID: sampleRun, Cycle: 2, Prompt: "p", Scenario: "demo",
		Observations: []events.Observation{{Cycle: 1, PlanIndex: intp(0), Action: "echo", OK: true, Output: "hi", Summary: "echoed"},
			{Cycle: 1, Action: "bad", OK: false, Error: &actionbus.Error{Code: actionbus.CodeTimeout}}},
		Feedback: &actionbus.Error{Code: actionbus.CodeSchemaValidation, Message: "args: /url missing"}},
	events.TypeDecisionMade: &events.DecisionMade{RunID: sampleRun, Cycle: 1, Planner: "script", Decision: events.Decision{
		Type: "plan", Reasoning: "parallel", PartialOK: true, SynthesizeInstruction: "direct",
		Actions: []events.Decision{{Type: "action", Name: "a.b", Args: map[string]any{"x": 1.0}}, {Type: "action", Name: "c"}}}},
	events.TypeActionRequested: &events.ActionRequested{RunID: sampleRun, CallID: "c1", Cycle: 1, PlanIndex: 0, Attempt: 1,
		Action: "delivery.searchJobs", Args: map[string]any{"status": []any{"FAILED"}}, Origin: events.OriginModel, UserID: "u", TimeoutMs: 1000},
	events.TypeActionCompleted: &events.ActionCompleted{RunID: sampleRun, CallID: "c1", Cycle: 1, PlanIndex: 0, Attempt: 1,
		Action: "delivery.searchJobs", Output: map[string]any{"jobIds": []any{"job_1"}}, Summary: "1 job", Complete: true, DurationMs: 3, Executor: "ex-1"},
	events.TypeActionFailed: &events.ActionFailed{RunID: sampleRun, CallID: "c1", Cycle: 1, PlanIndex: 3, Attempt: 2,
		Action: "x", Error: actionbus.Error{Code: actionbus.CodeTimeout, Message: "deadline"}, DurationMs: 1000, Executor: "ex-2"},
	events.TypeEventRejected: &events.EventRejected{Reason: actionbus.Error{Code: actionbus.CodeMalformedEvent, Message: "bad"},
		RunID: sampleRun, OriginalSubject: "ab.run.x.requested", OriginalHeaders: map[string][]string{"ce-id": {"1"}},
		OriginalData: []byte{0xff, 0x00, 'x'}, Stream: "AB_RUNS", StreamSequence: 7, Consumer: "dispatcher"},
	events.TypeAuditRecorded: &events.AuditRecorded{RunID: sampleRun, EventID: "e1", EventType: events.TypeRunStarted, Kind: "run", EventSubject: "ab.run.x.started",
		EventSource: "/actionbus/dispatcher", EventTime: time.Date(2026, 11, 30, 8, 0, 0, 123, time.UTC), Status: "ok",
		PayloadHash: "0f3c4e0b1a2d3c4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6", PrevHash: "",
		Hash: "aa3c4e0b1a2d3c4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6"},
	events.TypeAuditAppended: &events.AuditAppended{RunID: sampleRun, Records: []events.AuditRecorded{{RunID: sampleRun, EventID: "e1", EventType: events.TypeRunRequested, Kind: "run",
		EventSubject: "ab.run.default.x.requested", EventSource: "/client", EventTime: time.Date(2026, 11, 30, 8, 0, 0, 123, time.UTC), Status: "requested",
		PayloadHash: "0f3c4e0b1a2d3c4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6",
		Hash:        "bb3c4e0b1a2d3c4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6"}}},
	events.TypeInputProvided: &events.InputProvided{RunID: sampleRun, Answer: "the blue one", ProvidedBy: "operator_1"},
	events.TypePoolAnnounced: &events.PoolAnnounced{Executor: "exec-1", Pool: "gpu",
		Actions: []map[string]any{{"name": "gpu.render", "mode": "read"}}, Removed: []string{"gpu.old"}},
	events.TypeTimerFired: &events.TimerFired{RunID: sampleRun, Kind: events.TimerDecision, Cycle: 2, Stage: "planner",
		DueAt: time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)},
	events.TypeApprovalRequested: &events.ApprovalRequested{RunID: sampleRun, Input: map[string]any{"jobIds": []any{"job_1"}}, Reason: "tier 2",
		Context: events.ApprovalContext{ApprovalID: sampleRun + "-1-0", RunID: sampleRun, StepID: "c1", UserID: "u", Action: "delivery.retry",
			InputHash: "0f3c4e0b1a2d3c4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6", ExpiresAt: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}},
	events.TypeApprovalGranted: &events.ApprovalGranted{RunID: sampleRun, ApprovalID: sampleRun + "-1-0", Token: "k1.abc", Approver: "ops"},
	events.TypeApprovalDenied:  &events.ApprovalDenied{RunID: sampleRun, ApprovalID: sampleRun + "-1-0", Approver: "ops", Reason: "not today"},
	events.TypeApprovalResolved: &events.ApprovalResolved{RunID: sampleRun, ApprovalID: sampleRun + "-1-0", AnswerID: sampleRun, Outcome: events.ApprovalOutcomeRefused, Approver: "ops",
		Error: &actionbus.Error{Code: actionbus.CodeApprovalReplayed, Message: "approval was already answered"}},
	events.TypeSynthesisRequested: &events.SynthesisRequested{RunID: sampleRun, Cycle: 2, Part: events.PartSection, Index: 1, Prompt: "report",
		Instruction: "Write this result as a section.", Results: []events.Observation{{Cycle: 1, Action: "count", OK: true, Output: map[string]any{"n": 3.0}}}},
	events.TypeSynthesisCompleted: &events.SynthesisCompleted{RunID: sampleRun, Cycle: 2, Part: events.PartSection, Index: 1, Markdown: "Three rows."},
}
