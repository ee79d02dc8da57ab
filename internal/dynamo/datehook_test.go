package dynamo_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/ratelimit-proxy/ratelimit-proxy/internal/dynamo"
)

// TestDatesObservesEveryAttempt: the Dates hook sees each attempt of a call (a 500 then its
// retry), with the attempt's own timing on the injected clock and the header's time, and skips
// an answer with an Age header (it may come from a cache).
func TestDatesObservesEveryAttempt(t *testing.T) {
	dates := []string{"Thu, 03 Dec 2026 20:00:01 GMT", "Thu, 03 Dec 2026 20:00:02 GMT", "Thu, 03 Dec 2026 20:00:03 GMT"}
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		i := n.Add(1) - 1
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		w.Header().Set("Date", dates[min(i, 2)])
		switch i {
		case 0:
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}`)
			return
		case 2:
			w.Header().Set("Age", "3")
		}
		_, _ = io.WriteString(w, `{"TableNames":[]}`)
	}))
	defer srv.Close()

	type obs struct{ sent, received, date time.Time }
	var (
		mu  sync.Mutex
		got []obs
	)
	const shift = time.Hour // the injected clock: sent and received are read with it
	api, err := dynamo.NewClient(context.Background(), dynamo.ClientOptions{
		Region: "us-east-1", Endpoint: srv.URL,
		ConfigOptions: []func(*config.LoadOptions) error{
			config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("AKID", "SECRET", "")),
			config.WithSharedConfigFiles([]string{}), config.WithSharedCredentialsFiles([]string{}),
		},
		Now: func() time.Time { return time.Now().Add(shift) },
		Dates: func(sent, received, date time.Time) {
			mu.Lock()
			got = append(got, obs{sent, received, date})
			mu.Unlock()
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := time.Now().Add(shift)
	if _, err := api.ListTables(ctx, &dynamodb.ListTablesInput{}); err != nil {
		t.Fatalf("ListTables (a 500, then its retry): %v", err)
	}
	if _, err := api.ListTables(ctx, &dynamodb.ListTablesInput{Limit: aws.Int32(1)}); err != nil {
		t.Fatalf("ListTables (Age): %v", err)
	}
	after := time.Now().Add(shift)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 2 {
		t.Fatalf("%d observations %v, want 2 (both attempts of the first call, not the answer with Age)", len(got), got)
	}
	for i, o := range got {
		want, _ := http.ParseTime(dates[i])
		if !o.date.Equal(want) {
			t.Errorf("observation %d: date %v, want %v", i, o.date, want)
		}
		if o.sent.Before(before) || o.received.Before(o.sent) || o.received.After(after) {
			t.Errorf("observation %d: sent %v, received %v, want before <= sent <= received <= after on the shifted clock (%v, %v)",
				i, o.sent, o.received, before, after)
		}
	}
	if !got[0].received.Before(got[1].sent) {
		t.Errorf("the retry was sent at %v, before the first attempt's answer at %v: want one observation per attempt", got[1].sent, got[0].received)
	}
}
