package proxy

import (
	"net/http"
	"reflect"
	"testing"
)

func TestReviewHopByHop(t *testing.T) {
	ws := newUpgrades(DefaultUpgradeProtocols)
	tests := []struct {
		u    upgrades
		in   http.Header
		want http.Header
	}{
		{ws, http.Header{"Upgrade": {"h2c"}, "Http2-Settings": {"AAMA"}, "X": {"1"}}, http.Header{"X": {"1"}}},
		{ws, http.Header{"Upgrade": {"WebSocket"}}, http.Header{"Upgrade": {"WebSocket"}}},
		{ws, http.Header{"Upgrade": {"h2c, websocket", "TLS/1.2"}}, http.Header{"Upgrade": {"websocket"}}},
		{ws, http.Header{"Upgrade": {"websocket/13"}}, http.Header{"Upgrade": {"websocket/13"}}},
		{newUpgrades([]string{}), http.Header{"Upgrade": {"websocket"}}, http.Header{}},
		{ws, http.Header{"X": {"1"}}, http.Header{"X": {"1"}}},
	}
	for i, tt := range tests {
		tt.u.reviewHopByHop(tt.in)
		if !reflect.DeepEqual(tt.in, tt.want) {
			t.Errorf("%d: got %v, want %v", i, tt.in, tt.want)
		}
	}
}

func TestCheckSwitch(t *testing.T) {
	asked := &http.Request{Header: http.Header{"Upgrade": {"websocket"}}}
	plain := &http.Request{Header: http.Header{}}
	for _, tt := range []struct {
		res  *http.Response
		fail bool
	}{
		{&http.Response{StatusCode: 101, Request: asked}, false},
		{&http.Response{StatusCode: 101, Request: plain}, true},
		{&http.Response{StatusCode: 101}, true},
		{&http.Response{StatusCode: 200, Request: plain}, false},
	} {
		if err := checkSwitch(tt.res); (err != nil) != tt.fail {
			t.Errorf("checkSwitch(%d, upgrade %v) = %v, want failure %v", tt.res.StatusCode, tt.res.Request != nil && tt.res.Request.Header["Upgrade"] != nil, err, tt.fail)
		}
	}
}
