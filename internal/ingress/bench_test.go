package ingress_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/actionbus/actionbus/actionbustest"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/ingress"
)

// BenchmarkStore compares one request stored directly into the requests
// stream (as tenants did before the ingress) with the same request
// through the ingress: the difference is the hop the ingress adds.
func BenchmarkStore(b *testing.B) {
	srv := actionbustest.NewServer(b, actionbustest.Options{})
	in, err := ingress.New(srv.Connect(b), ingress.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := in.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(in.Stop)
	js, err := jetstream.New(srv.Connect(b))
	if err != nil {
		b.Fatal(err)
	}
	subjects := events.MustSubjects("ab")
	body := make([]byte, 512)
	ctx := context.Background()
	for _, c := range []struct {
		name    string
		subject func(run string) string
	}{
		{"direct", func(run string) string { return subjects.Ingested("acme", run, "input") }},
		{"ingress", func(run string) string { return subjects.Run("acme", run, "input") }},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				run := events.NewID()
				if _, err := js.Publish(ctx, c.subject(run), body, jetstream.WithMsgID(run)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
