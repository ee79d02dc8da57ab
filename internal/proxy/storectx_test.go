package proxy

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestStoreCtxErrWithoutDone(t *testing.T) {
	future := time.Now().Add(time.Hour)
	c := newStoreCtx(context.Background(), future)
	if err := c.Err(); err != nil {
		t.Errorf("before the deadline: Err got %v, want nil", err)
	}
	if d, ok := c.Deadline(); !ok || !d.Equal(future) {
		t.Errorf("Deadline got %v %v, want %v true", d, ok, future)
	}
	if c.materialised() != nil {
		t.Error("Err and Deadline built the real context; they must not")
	}

	past := newStoreCtx(context.Background(), time.Now().Add(-time.Millisecond))
	if err := past.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("past deadline: Err got %v, want DeadlineExceeded", err)
	}

	parent, cancel := context.WithCancel(context.Background())
	c = newStoreCtx(parent, future)
	cancel()
	if err := c.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled parent: Err got %v, want Canceled", err)
	}
}

func TestStoreCtxKeepsTheEarlierParentDeadline(t *testing.T) {
	soon := time.Now().Add(time.Minute)
	parent, cancel := context.WithDeadline(context.Background(), soon)
	defer cancel()
	c := newStoreCtx(parent, soon.Add(time.Hour))
	if d, _ := c.Deadline(); !d.Equal(soon) {
		t.Errorf("Deadline got %v, want the parent's %v", d, soon)
	}
}

func TestStoreCtxDoneAndChildren(t *testing.T) {
	// A past deadline: the real context is done as soon as Done builds it.
	c := newStoreCtx(context.Background(), time.Now().Add(-time.Millisecond))
	select {
	case <-c.Done():
	default:
		t.Fatal("Done not closed although the deadline has passed")
	}
	if err := c.Err(); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("after Done: Err got %v, want DeadlineExceeded", err)
	}

	// A child derived from it (as an SDK does) ends when the parent request ends.
	parent, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "v"))
	c = newStoreCtx(parent, time.Now().Add(time.Hour))
	child, cancelChild := context.WithCancel(c)
	defer cancelChild()
	if got := child.Value(ctxKey{}); got != "v" {
		t.Errorf("child Value got %v, want the parent's value", got)
	}
	cancel()
	<-child.Done() // would block forever if cancellation did not propagate
	if !errors.Is(child.Err(), context.Canceled) {
		t.Errorf("child Err got %v, want Canceled", child.Err())
	}

	// release ends a materialised context.
	c = newStoreCtx(context.Background(), time.Now().Add(time.Hour))
	done := c.Done()
	c.release()
	<-done
	if !errors.Is(c.Err(), context.Canceled) {
		t.Errorf("after release: Err got %v, want Canceled", c.Err())
	}
}

type ctxKey struct{}
