package accounts

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/actionbus/actionbus"
)

// The system account's subjects that update and delete account JWTs in
// a full resolver.
const (
	claimsUpdate = "$SYS.REQ.CLAIMS.UPDATE"
	claimsDelete = "$SYS.REQ.CLAIMS.DELETE"
)

// claimsReply is the server's answer to a claims update or deletion.
type claimsReply struct {
	Data *struct {
		Account string `json:"account"`
		Code    int    `json:"code"`
		Message string `json:"message"`
	} `json:"data"`
	Error *struct {
		Account     string `json:"account"`
		Code        int    `json:"code"`
		Description string `json:"description"`
	} `json:"error"`
}

// Push sends an account JWT to the server's resolver through the system
// account (nc is a system account user's connection): the server stores
// it and applies it at once to the account's connections, no restart. A
// refusal is a typed account_refused error.
func Push(ctx context.Context, nc *nats.Conn, accountJWT string) error {
	return request(ctx, nc, claimsUpdate, accountJWT)
}

// Delete sends an operator-signed deletion request ([DeleteClaims]) to
// the server's resolver through the system account.
func Delete(ctx context.Context, nc *nats.Conn, deletion string) error {
	return request(ctx, nc, claimsDelete, deletion)
}

func request(ctx context.Context, nc *nats.Conn, subject, body string) error {
	msg, err := nc.RequestWithContext(ctx, subject, []byte(body))
	if err != nil {
		return refused(subject, err.Error())
	}
	var r claimsReply
	if err := json.Unmarshal(msg.Data, &r); err != nil {
		return refused(subject, "unreadable reply: "+err.Error())
	}
	if r.Error != nil {
		return refused(subject, fmt.Sprintf("%d %s", r.Error.Code, r.Error.Description))
	}
	if r.Data == nil {
		return refused(subject, "empty reply")
	}
	return nil
}

func refused(subject, why string) error {
	return actionbus.Errorf(actionbus.CodeAccountRefused, "the NATS server did not apply the account change: %w", errors.New(why)).
		WithDetail("subject", subject)
}
