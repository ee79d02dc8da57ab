package dynamo

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
)

// answerGrace is how long the store may leave a call without any answer before it is treated
// as down rather than slow (see liveAPI.silent).
const answerGrace = time.Second

// liveAPI is the Store's API, watched for answers: it tells a store that answers slowly (a
// decision that waited in vain is then a rejection: the pool had nothing for it in time) from
// one that does not answer at all (an error: on_error decides). The sign is the age of the
// oldest call sent since the last answer, not the time since the last answer: a pool or a
// replica that was idle has had no answers because it asked nothing.
type liveAPI struct {
	API
	// asked is when the first call since the last answer was sent (Unix ns), 0 when no call
	// has been waiting since.
	asked atomic.Int64
	// rtt is the smoothed time the service took to answer (ns), over every call: a new lease
	// pool starts from it (see lease.Table.RTT).
	rtt   atomic.Int64
	grace time.Duration
	now   func() time.Time // wall clock, whatever the decisions' instants
}

// ask records a call sent at the returned instant.
func (l *liveAPI) ask() time.Time {
	at := l.now()
	l.asked.CompareAndSwap(0, at.UnixNano())
	return at
}

// answer records that the service answered a call sent at sent, if err is an answer: a success
// or an error of the service's (a failed condition, throttling, a validation error), not a
// transport error or a deadline.
func (l *liveAPI) answer(sent time.Time, err error) {
	var ae smithy.APIError
	if err != nil && !errors.As(err, &ae) {
		return
	}
	l.asked.Store(0)
	took := int64(l.now().Sub(sent))
	// An EWMA of 1/8 per call; racing updates may drop one sample, which is harmless.
	if old := l.rtt.Load(); old == 0 {
		l.rtt.Store(took)
	} else {
		l.rtt.Store(old + (took-old)/8)
	}
}

// silent reports whether a call has been waiting for longer than the grace with no answer to
// any call since it was sent.
func (l *liveAPI) silent() bool {
	a := l.asked.Load()
	return a != 0 && l.now().UnixNano()-a > int64(l.grace)
}

func (l *liveAPI) UpdateItem(ctx context.Context, in *dynamodb.UpdateItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	sent := l.ask()
	out, err := l.API.UpdateItem(ctx, in, optFns...)
	l.answer(sent, err)
	return out, err
}

func (l *liveAPI) BatchGetItem(ctx context.Context, in *dynamodb.BatchGetItemInput, optFns ...func(*dynamodb.Options)) (*dynamodb.BatchGetItemOutput, error) {
	sent := l.ask()
	out, err := l.API.BatchGetItem(ctx, in, optFns...)
	l.answer(sent, err)
	return out, err
}

func (l *liveAPI) TransactWriteItems(ctx context.Context, in *dynamodb.TransactWriteItemsInput, optFns ...func(*dynamodb.Options)) (*dynamodb.TransactWriteItemsOutput, error) {
	sent := l.ask()
	out, err := l.API.TransactWriteItems(ctx, in, optFns...)
	l.answer(sent, err)
	return out, err
}
