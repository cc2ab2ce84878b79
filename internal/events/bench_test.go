package events_test

import (
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/actionbus/actionbus/internal/events"
)

func newEventB(b *testing.B, typ, ct string) *event.Event {
	b.Helper()
	e := event.New()
	e.SetID(events.NewID())
	e.SetType(typ)
	e.SetSource("/actionbus/bench")
	e.SetExtension(events.ExtRunID, sampleRun)
	if err := events.SetData(&e, ct, samples[typ]); err != nil {
		b.Fatal(err)
	}
	return &e
}

func BenchmarkEncodeBinary(b *testing.B) {
	e := newEventB(b, events.TypeActionRequested, events.ContentTypeJSON)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.Encode("ab.pool.default.request", e, events.ModeBinary); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeBinary(b *testing.B) {
	e := newEventB(b, events.TypeActionRequested, events.ContentTypeJSON)
	msg, _ := events.Encode("s", e, events.ModeBinary)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := events.Decode("s", msg.Header, msg.Data); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkValidate(b *testing.B) {
	for _, ct := range []string{events.ContentTypeJSON, events.ContentTypeMsgpack} {
		b.Run(ct, func(b *testing.B) {
			e := newEventB(b, events.TypeActionRequested, ct)
			b.ReportAllocs()
			for b.Loop() {
				if err := events.Validate(e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkDerivedID(b *testing.B) {
	run := events.NewID()
	b.ReportAllocs()
	for b.Loop() {
		_ = events.DerivedID(run, "call", 3, 7, 1)
	}
}
