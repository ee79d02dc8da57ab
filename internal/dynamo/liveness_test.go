package dynamo

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// errAPI answers every UpdateItem with err.
type errAPI struct {
	API
	err error
}

func (e errAPI) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	return nil, e.err
}

// TestLivenessCountsServiceErrorsAsAnswers: a failed condition or throttling is the service
// answering; a transport error or a deadline is not. Silence is the age of the oldest call
// since the last answer.
func TestLivenessCountsServiceErrorsAsAnswers(t *testing.T) {
	at := time.Unix(1_000, 0)
	now := func() time.Time { return at }
	for _, tc := range []struct {
		name   string
		err    error
		answer bool
	}{
		{"success", nil, true},
		{"failed condition", &types.ConditionalCheckFailedException{Message: aws.String("no")}, true},
		{"throttled", &types.ProvisionedThroughputExceededException{Message: aws.String("slow down")}, true},
		{"connection refused", errors.New("dial tcp 127.0.0.1:8000: connect: connection refused"), false},
		{"deadline", context.DeadlineExceeded, false},
	} {
		l := &liveAPI{API: errAPI{err: tc.err}, grace: time.Second, now: now}
		l.asked.Store(at.Add(-time.Hour).UnixNano()) // a call unanswered for an hour
		_, _ = l.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{})
		if got := !l.silent(); got != tc.answer {
			t.Errorf("%s: answered = %v, want %v", tc.name, got, tc.answer)
		}
	}
	l := &liveAPI{API: errAPI{err: context.DeadlineExceeded}, grace: time.Second, now: now}
	_, _ = l.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{})
	if l.silent() {
		t.Error("a call sent just now: silent, want not yet (within the grace)")
	}
	at = at.Add(2 * time.Second)
	if !l.silent() {
		t.Error("a call unanswered for 2s with a 1s grace: not silent, want silent")
	}
}

// slowAPI answers every UpdateItem with err after moving the clock on by took.
type slowAPI struct {
	API
	at   *time.Time
	took time.Duration
	err  error
}

func (s slowAPI) UpdateItem(context.Context, *dynamodb.UpdateItemInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateItemOutput, error) {
	*s.at = s.at.Add(s.took)
	return nil, s.err
}

// TestLivenessSmoothsTheRoundTrip: the round trip new lease pools start from is the answered
// calls' time, smoothed; a call that got no answer says nothing about it.
func TestLivenessSmoothsTheRoundTrip(t *testing.T) {
	at := time.Unix(1_000, 0)
	l := &liveAPI{grace: time.Second, now: func() time.Time { return at }}
	for _, c := range []struct {
		took time.Duration
		err  error
		want time.Duration
	}{
		{10 * time.Millisecond, nil, 10 * time.Millisecond}, // the first answer is the estimate
		{18 * time.Millisecond, &types.ConditionalCheckFailedException{}, 11 * time.Millisecond},
		{time.Second, context.DeadlineExceeded, 11 * time.Millisecond}, // no answer: unchanged
	} {
		l.API = slowAPI{at: &at, took: c.took, err: c.err}
		_, _ = l.UpdateItem(context.Background(), &dynamodb.UpdateItemInput{})
		if got := time.Duration(l.rtt.Load()); got != c.want {
			t.Errorf("after a call of %v (err %v): rtt %v, want %v", c.took, c.err, got, c.want)
		}
	}
}
