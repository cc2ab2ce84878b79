package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// LeaderGet is what [GetFromLeader] reads: the message at Seq, or the
// first at or after Seq on the subject NextFor, or the last on LastFor.
type LeaderGet struct {
	Seq     uint64 `json:"seq,omitempty"`
	LastFor string `json:"last_by_subj,omitempty"`
	NextFor string `json:"next_by_subj,omitempty"`
}

// GetFromLeader reads one stored message of stream with the JetStream
// API's message get ($JS.API.STREAM.MSG.GET.<stream>), whatever the
// stream allows: the leader answers with a JSON document that holds the
// message, where a direct get answers with the stored message itself, on
// whatever reply subject the asker named. A party that may write a store
// and direct-get it so has the server publish a body of its choosing
// anywhere in the account — onto the JetStream API, or another tenant's
// run state (docs/security.md) — so a user that writes a store reads it
// this way only, and its permissions hold no direct get of it. The
// message returned carries the server's subject, sequence and time.
// No such message is [jetstream.ErrMsgNotFound]; another API error is a
// [*jetstream.APIError].
func GetFromLeader(ctx context.Context, js jetstream.JetStream, stream string, req LeaderGet) (*jetstream.RawStreamMsg, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, js.Options().DefaultTimeout)
		defer cancel()
	}
	m, err := js.Conn().RequestWithContext(ctx, apiPrefix(js.Options())+"STREAM.MSG.GET."+stream, body)
	if err != nil {
		return nil, fmt.Errorf("bus: get from %s: %w", stream, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error"`
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("bus: get from %s: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, fmt.Errorf("bus: get from %s: %w", stream, jetstream.ErrInvalidJetStreamResponse)
	}
	out := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence,
		Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if out.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("bus: get from %s: %w", stream, err)
		}
	}
	return out, nil
}

// apiPrefix is the subject prefix of o's JetStream API requests, as
// jetstream forms it: the domain's when o names one.
func apiPrefix(o jetstream.JetStreamOptions) string {
	if o.Domain != "" {
		return "$JS." + o.Domain + ".API."
	}
	if o.APIPrefix == "" {
		return jetstream.DefaultAPIPrefix
	}
	return strings.TrimSuffix(o.APIPrefix, ".") + "."
}
