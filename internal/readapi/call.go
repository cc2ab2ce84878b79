package readapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/actionbus/actionbus"
	"github.com/actionbus/actionbus/events"
	"github.com/actionbus/actionbus/internal/bus"
)

// Caller calls the read service for one tenant. It is safe for concurrent
// use.
type Caller struct {
	nc       *nats.Conn
	subjects events.Subjects
	tenant   string
	// RetryFor bounds how long a call retries while no read service
	// answers (none started yet, one restarting); default 15 s.
	RetryFor time.Duration
}

// DefaultCallTimeout bounds one request when ctx has no deadline.
const DefaultCallTimeout = 15 * time.Second

// NewCaller returns a caller of the read service under prefix for tenant.
func NewCaller(nc *nats.Conn, prefix, tenant string) *Caller {
	return &Caller{nc: nc, subjects: bus.Topology{Prefix: prefix}.Subjects(), tenant: tenant, RetryFor: 15 * time.Second}
}

// Call sends req to op and decodes the answer into out. A refusal is the
// service's *actionbus.Error (its code kept); a service that does not
// answer is retried for RetryFor, then the error is a timeout.
func (c *Caller) Call(ctx context.Context, op string, req Request, out any) error {
	if req.MaxBytes == 0 {
		req.MaxBytes = max(MinPageBytes, PageBudget(c.nc.MaxPayload()))
	}
	body, err := json.Marshal(req)
	if err != nil {
		return err
	}
	subject := c.subjects.API(c.tenant, op)
	deadline := time.Now().Add(c.RetryFor)
	wait := 50 * time.Millisecond
	for {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if _, ok := ctx.Deadline(); !ok {
			rctx, cancel = context.WithTimeout(ctx, DefaultCallTimeout)
		}
		msg, err := c.nc.RequestWithContext(rctx, subject, body)
		cancel()
		if err == nil {
			return decodeReply(msg, out)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("read service %s: %w", op, err)
		}
		if time.Now().After(deadline) {
			return actionbus.Errorf(actionbus.CodeTimeout, "read service %s: no answer: %w", op, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Second)
	}
}

// decodeReply turns a reply into out, or into the typed error it carries.
func decodeReply(msg *nats.Msg, out any) error {
	if code := msg.Header.Get(micro.ErrorCodeHeader); code != "" {
		var abErr actionbus.Error
		if json.Unmarshal(msg.Data, &abErr) != nil || abErr.Code == "" {
			abErr = actionbus.Error{Code: actionbus.Code(code), Message: msg.Header.Get(micro.ErrorHeader)}
		}
		return &abErr
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return actionbus.Errorf(actionbus.CodeInternal, "read service: an answer that does not decode: %v", err)
	}
	return nil
}

// Scan reads the pages of an events, runs or audit read from req's
// position, reassembling cut messages, and calls fn with each message in
// stream order until fn returns false or the messages run out. It
// returns the sequence to read after next time.
func (c *Caller) Scan(ctx context.Context, op string, req Request, fn func(Msg) bool) (uint64, error) {
	next := req.After
	var partial *Msg
	for {
		var p Page
		if err := c.Call(ctx, op, req, &p); err != nil {
			return next, err
		}
		for _, m := range p.Msgs {
			if partial != nil {
				if m.Seq != partial.Seq || m.Offset != len(partial.Data) {
					return next, actionbus.Errorf(actionbus.CodeInternal, "read service: message %d changed while it was read", partial.Seq)
				}
				partial.Data = append(partial.Data, m.Data...)
				m = *partial
				partial = nil
			}
			if m.Cut() {
				cp := m
				cp.Data = append([]byte(nil), m.Data...)
				partial = &cp
				break
			}
			next = m.Seq
			if !fn(m) {
				return next, nil
			}
		}
		if partial != nil {
			req.Since, req.After, req.Offset = nil, partial.Seq-1, len(partial.Data)
			continue
		}
		if !p.More {
			if p.Next > next {
				next = p.Next
			}
			return next, nil
		}
		req.Since, req.After, req.Offset = nil, p.Next, 0
		next = max(next, p.Next)
	}
}
