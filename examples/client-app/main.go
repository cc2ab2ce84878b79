// Command client-app is a program outside the actionbus module that uses
// the public client API as a user would: it starts a run, follows it,
// approves what the run asks for with an approval key, reads the run's
// audit records as they are written, and records the run for replay.
//
//	NATS_URL=nats://127.0.0.1:4222 APPROVAL_KEY=k1:<base64> client-app "Which failed jobs can we retry?"
package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus/client"
)

func main() {
	if len(os.Args) < 2 {
		log.Fatal("usage: client-app PROMPT")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()

	nc, err := nats.Connect(os.Getenv("NATS_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	c, err := client.New(nc, client.Options{Source: "/example/client-app"})
	if err != nil {
		log.Fatal(err)
	}
	keyID, key, err := approvalKey(os.Getenv("APPROVAL_KEY"))
	if err != nil {
		log.Fatal(err)
	}

	runID, err := c.Start(ctx, client.RunRequest{Prompt: os.Args[1], UserID: "example-user", AllowedModes: []string{"read", "dryRun", "mutate"}})
	if err != nil {
		log.Fatal(err)
	}
	// The audit stream of this run, printed as records are written.
	go func() {
		err := c.AuditStream(ctx, client.AuditQuery{RunID: runID, Live: true}, func(seq uint64, rec client.AuditRecord) error {
			fmt.Printf("audit %d: %s %s %s\n", seq, rec.Kind, rec.Status, rec.Summary)
			return nil
		})
		if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			log.Printf("audit stream: %v", err)
		}
	}()
	res, err := c.Follow(ctx, runID, func(e client.Event) {
		s, ok := e.Step()
		if !ok {
			return
		}
		fmt.Printf("step %s %s\n", s.Name, s.Message)
		if s.Name != "awaiting-approval" || key == nil {
			return
		}
		approvalID, _ := s.Details["approvalId"].(string)
		p, err := c.Approval(ctx, approvalID)
		if err != nil {
			log.Printf("approval %s: %v", approvalID, err)
			return
		}
		var ac client.ApprovalContext = p.Context
		fmt.Printf("approving %s of %s (input %s)\n", ac.Action, orNone(ac.UserID), ac.InputHash)
		if err := c.Approve(ctx, approvalID, keyID, key); err != nil {
			log.Printf("approval %s refused: %v", approvalID, err)
		}
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("run %s %s: %s\n", runID, res.Status, res.Answer)

	rec, err := c.Record(ctx, runID)
	if err != nil {
		log.Fatal(err)
	}
	var decisions []client.Decision = rec.Decisions
	fmt.Printf("recorded %d decisions for replay\n", len(decisions))
}

// approvalKey parses "kid:base64secret"; empty means no approvals.
func approvalKey(s string) (string, []byte, error) {
	if s == "" {
		return "", nil, nil
	}
	kid, b64, ok := strings.Cut(s, ":")
	if !ok {
		return "", nil, errors.New("APPROVAL_KEY is kid:base64secret")
	}
	key, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", nil, fmt.Errorf("APPROVAL_KEY: %w", err)
	}
	return kid, key, nil
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
