package bus_test

import (
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
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

// BenchmarkRoundTrip is one event from typed data to the wire and back to
// typed data: SetData + Encode, then Decode + DataAs, per codec and mode.
func BenchmarkRoundTrip(b *testing.B) {
	for _, ct := range []string{events.ContentTypeJSON, events.ContentTypeMsgpack} {
		for _, mode := range []bus.Mode{bus.ModeBinary, bus.ModeStructured} {
			b.Run(mode.String()+"/"+ct, func(b *testing.B) {
				e := newEventB(b, events.TypeActionRequested, ct)
				b.ReportAllocs()
				for b.Loop() {
					if err := events.SetData(e, ct, samples[events.TypeActionRequested]); err != nil {
						b.Fatal(err)
					}
					msg, err := bus.Encode("ab.pool.default.request", e, mode)
					if err != nil {
						b.Fatal(err)
					}
					out, err := bus.Decode(msg.Subject, msg.Header, msg.Data)
					if err != nil {
						b.Fatal(err)
					}
					var req events.ActionRequested
					if err := events.DataAs(out, &req); err != nil {
						b.Fatal(err)
					}
				}
			})
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
