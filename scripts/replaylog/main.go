// Command replaylog writes a synthetic, reproducible access log for `ratelimit-replay`:
// the demo of docs/replay.md and the README's picture, the replay benchmark's input and a test
// fixture. Traffic, from 09:00 UTC on 2026-11-24:
//
//   - 300 well-behaved clients (one address and API key each) at about 40 requests/s in all,
//     rising and falling slowly;
//   - from minute 5 to minute 12, a scraper with one key and one address at 30 requests/s;
//   - from minute 15 to minute 17, a flash crowd: every client at ten times its rate.
//
// Paths are /api/orders, /api/search (the API) and /static/app.js. The same flags always give
// the same lines.
//
//	go run ./scripts/replaylog -minutes 20 -format combined > demo.log
package main

import (
	"bufio"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"os"
	"time"
)

func main() {
	minutes := flag.Int("minutes", 20, "minutes of traffic")
	format := flag.String("format", "combined", "combined (with the API key as an extra field), alb or json")
	seed := flag.Uint64("seed", 1, "random seed")
	flag.Parse()
	if *format != "combined" && *format != "alb" && *format != "json" {
		log.Fatalf("format %q: want combined, alb or json", *format)
	}
	w := bufio.NewWriterSize(os.Stdout, 1<<20)
	defer func() {
		if err := w.Flush(); err != nil {
			fmt.Fprintln(os.Stderr, "replaylog:", err)
			os.Exit(1)
		}
	}()
	rng := rand.New(rand.NewPCG(*seed, 42))
	start := time.Date(2026, 11, 24, 9, 0, 0, 0, time.UTC)
	const clients = 300
	paths := []string{"/api/orders", "/api/search", "/api/search", "/static/app.js"}
	end := start.Add(time.Duration(*minutes) * time.Minute)
	for t := start; t.Before(end); t = t.Add(time.Second) {
		m := t.Sub(start).Minutes()
		base := 40 * (1 + 0.3*math.Sin(m/3))
		if m >= 15 && m < 17 {
			base *= 10
		}
		n := poisson(rng, base)
		scraper := 0
		if m >= 5 && m < 12 {
			scraper = poisson(rng, 30)
		}
		// Lines of one second in arrival order: offsets sorted by construction.
		total := n + scraper
		for i := range total {
			at := t.Add(time.Duration(i) * time.Second / time.Duration(total))
			c := rng.IntN(clients)
			ip := fmt.Sprintf("198.51.%d.%d", 100+c/250, 1+c%250)
			key := fmt.Sprintf("key-%03d", c)
			path := paths[rng.IntN(len(paths))]
			if i%total >= n { // the scraper's share, spread through the second
				ip, key, path = "203.0.113.66", "key-scraper", "/api/search"
			}
			write(w, *format, at, ip, key, path)
		}
	}
}

func write(w *bufio.Writer, format string, at time.Time, ip, key, path string) {
	switch format {
	case "combined":
		fmt.Fprintf(w, "%s - - [%s] \"GET %s?page=1 HTTP/1.1\" 200 512 \"-\" \"demo/1.0\" \"%s\"\n",
			ip, at.Format("02/Jan/2006:15:04:05 -0700"), path, key)
	case "alb":
		ts := at.Format("2006-01-02T15:04:05.000000Z")
		fmt.Fprintf(w, "https %s app/demo/50dc6c495c0c9188 %s:%d 10.0.0.1:80 0.000 0.001 0.000 200 200 34 366 "+
			"\"GET https://api.example.com:443%s?page=1 HTTP/1.1\" \"demo/1.0\" ECDHE-RSA-AES128-GCM-SHA256 TLSv1.2 "+
			"arn:aws:elasticloadbalancing:us-east-1:123456789012:targetgroup/demo/73e2d6bc24d8a067 "+
			"\"Root=1-58337262-36d228ad5d99923122bbe354\" \"api.example.com\" \"-\" 0 %s \"forward\" \"-\" \"-\" "+
			"\"10.0.0.1:80\" \"200\" \"-\" \"-\"\n", ts, ip, 40000+len(key), path, ts)
	case "json":
		// The gateway's log.access line; the keys stand in for pseudonyms.
		fmt.Fprintf(w, "{\"level\":\"info\",\"ts\":%q,\"logger\":\"access\",\"msg\":\"request\",\"time\":%q,"+
			"\"method\":\"GET\",\"path\":%q,\"status\":200,\"duration_seconds\":0.001,\"decision\":\"allowed\","+
			"\"keys\":{\"ip\":\"ip-%s\",\"api_key\":\"pk-%s\"}}\n",
			at.Format("2006-01-02T15:04:05.000Z0700"), at.Format(time.RFC3339Nano), path, ip, key)
	}
}

// poisson draws a Poisson variate of mean lambda (normal approximation above 30).
func poisson(rng *rand.Rand, lambda float64) int {
	if lambda > 30 {
		return max(0, int(math.Round(lambda+math.Sqrt(lambda)*rng.NormFloat64())))
	}
	l, k, p := math.Exp(-lambda), 0, 1.0
	for {
		p *= rng.Float64()
		if p < l {
			return k
		}
		k++
	}
}
