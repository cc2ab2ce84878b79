package events_test

import (
	"fmt"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/actionbus/actionbus/events"
)

// A run.requested event, built, validated against its schema and read back
// the way a receiver reads it. Every run id is a ULID ([events.NewID]).
func Example() {
	const runID = "01JDQ2Z7W4M3T2V9K8F6H5G4C3" // events.NewID() in a program
	e := event.New()
	e.SetID(events.NewID())
	e.SetType(events.TypeRunRequested)
	e.SetSource("/example")
	e.SetExtension(events.ExtRunID, runID)
	e.SetExtension(events.ExtTenant, events.DefaultTenant)
	if err := events.SetData(&e, "", &events.RunRequested{RunID: runID, Prompt: "retry failed jobs"}); err != nil {
		panic(err)
	}
	fmt.Println("valid:", events.Validate(&e) == nil)

	var req events.RunRequested
	if err := events.DataAs(&e, &req); err != nil {
		panic(err)
	}
	fmt.Println(req.Prompt)
	// Output:
	// valid: true
	// retry failed jobs
}

// The subject an event type travels on, from the catalog.
func ExampleSubjects_SubjectFor() {
	s := events.MustSubjects(events.DefaultPrefix)
	subject, err := s.SubjectFor(events.TypeRunRequested, events.DefaultTenant, "01JDQ2Z7W4M3T2V9K8F6H5G4C3", "")
	if err != nil {
		panic(err)
	}
	entry, _ := events.Lookup(events.TypeRunRequested)
	fmt.Println(subject)
	fmt.Println(entry.Producer)
	// Output:
	// ab.run.default.01JDQ2Z7W4M3T2V9K8F6H5G4C3.requested
	// client
}

// Run ids are canonical ULIDs; anything else is refused with a typed
// invalid_run_id error.
func ExampleCheckRunID() {
	fmt.Println(events.ValidRunID(events.NewID()))
	fmt.Println(events.CheckRunID("run-1") != nil)
	// Output:
	// true
	// true
}

// The reference to 20 bytes stored as artifact "out-1" in the services'
// store, with a preview of at most 8 bytes: a reader checks what it reads
// back against the SHA-256, and shows the preview without reading it.
func ExampleNewArtifactRef() {
	ref := events.NewArtifactRef("ab_artifacts", "out-1", "output", "application/json", []byte(`{"total":1234567890}`), 8)
	fmt.Println(ref.Bytes, ref.Preview, ref.Truncated)
	fmt.Println(ref.SHA256[:16])
	// Output:
	// 20 {"total" true
	// 41cae5e97986c05c
}
