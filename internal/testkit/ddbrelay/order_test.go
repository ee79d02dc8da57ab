package ddbrelay_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/ddbrelay"
	"github.com/ratelimit-proxy/ratelimit-proxy/internal/testkit/dynamolocal"
)

// eventually polls cond until it holds or the deadline passes: a relay's background sends.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
}

func TestLateWriteLandsAfterItsClientGaveUp(t *testing.T) {
	r, c, direct, table := faultyTable(t, 1, ddbrelay.Fault{Kind: ddbrelay.FaultLateWrite, Item: regexp.MustCompile(`^late$`), Rate: 1, Hold: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	_, err := c.UpdateItem(ctx, add(table, "late"))
	cancel()
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the held write answered %v, want its client's deadline", err)
	}
	// The client gave up first; the write lands after.
	eventually(t, "the late write lands", func() bool { return count(t, direct, table, "late") == 1 })
	if got := r.Stats().Faults[ddbrelay.FaultLateWrite]; got != 1 {
		t.Errorf("late writes got %d, want 1", got)
	}
	// Reads go through: the fault is one of writes.
	if got := count(t, c, table, "late"); got != 1 {
		t.Errorf("counter read through the relay got %d, want 1", got)
	}
}

func TestDelayedDuplicateLandsAfterTheNextWriteToItsItem(t *testing.T) {
	r, c, direct, table := faultyTable(t, 1, ddbrelay.Fault{Kind: ddbrelay.FaultDelayedDuplicate, Item: regexp.MustCompile(`^dup$`), Rate: 1, Hold: time.Minute})
	if _, err := c.UpdateItem(context.Background(), add(table, "dup")); err != nil {
		t.Fatal(err)
	}
	// Answered, applied once; its copy waits for another write to the item.
	if got := count(t, direct, table, "dup"); got != 1 {
		t.Fatalf("after the first write: %d, want 1 (the copy is held)", got)
	}
	if _, err := direct.UpdateItem(context.Background(), add(table, "other")); err != nil {
		t.Fatal(err)
	}
	if got, held := count(t, direct, table, "dup"), r.Stats().Held; got != 1 || held != 1 {
		t.Fatalf("after a write to another item: %d applied, %d held; want 1 and 1", got, held)
	}
	// The second write (itself given a copy) lands, and the first copy follows it.
	if _, err := c.UpdateItem(context.Background(), add(table, "dup")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the first copy lands after the second write", func() bool { return count(t, direct, table, "dup") == 3 })
	r.Close() // sends the second copy
	if got := count(t, direct, table, "dup"); got != 4 {
		t.Errorf("after Close: %d, want 2 writes + 2 copies = 4", got)
	}
	if st := r.Stats(); st.Faults[ddbrelay.FaultDelayedDuplicate] != 2 || st.Held != 0 {
		t.Errorf("delayed duplicates %d, held %d; want 2 and 0", st.Faults[ddbrelay.FaultDelayedDuplicate], st.Held)
	}
}

func TestReorderLetsALaterWriteOfTheSameSourceLandFirst(t *testing.T) {
	r, _, direct, table := faultyTable(t, 1, ddbrelay.Fault{Kind: ddbrelay.FaultReorder, Item: regexp.MustCompile(`^first$`), Rate: 1, Hold: time.Minute})
	client := func(source string) *dynamodb.Client {
		srv := httptest.NewServer(r.Source(source))
		t.Cleanup(srv.Close)
		c, err := dynamolocal.NewClient(context.Background(), srv.URL, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := client("a"), client("b")
	done := make(chan error, 1)
	go func() {
		_, err := a.UpdateItem(context.Background(), add(table, "first"))
		done <- err
	}()
	eventually(t, "the first write is held", func() bool { return r.Stats().Held == 1 })
	// Another source's write does not release it.
	if _, err := b.UpdateItem(context.Background(), add(table, "second")); err != nil {
		t.Fatal(err)
	}
	if got, held := count(t, direct, table, "first"), r.Stats().Held; got != 0 || held != 1 {
		t.Fatalf("after another source's write: first applied %d, held %d; want 0 and 1", got, held)
	}
	// A later write of the same source lands first; then the held one.
	if _, err := a.UpdateItem(context.Background(), add(table, "second")); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the held write: %v", err)
	}
	if got := count(t, direct, table, "first"); got != 1 {
		t.Errorf("first got %d, want 1", got)
	}
	if st := r.Stats(); st.Faults[ddbrelay.FaultReorder] != 1 || st.Held != 0 {
		t.Errorf("reorders %d, held %d; want 1 and 0", st.Faults[ddbrelay.FaultReorder], st.Held)
	}
}

func TestNewRejectsANegativeHold(t *testing.T) {
	_, err := ddbrelay.New("http://127.0.0.1:1", ddbrelay.Options{Faults: []ddbrelay.Fault{{Kind: ddbrelay.FaultReorder, Rate: 1, Hold: -time.Second}}})
	if err == nil || !strings.Contains(err.Error(), "Faults[0].Hold -1s") {
		t.Errorf("error %v, want one naming Faults[0].Hold -1s", err)
	}
}
