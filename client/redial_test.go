package client_test

import (
	"reflect"
	"testing"

	"github.com/kerneldeck/kerneldeck/client"
)

// A Redialer stands in for a Client in the modes that reconnect (mcp,
// repl): it has each of the Client's calls, except those that belong to
// one connection (a dashboard uses those, and reattaches by itself). A
// call a consumer finds missing degrades silently (mcp's Refresh did), so
// a new Client call must be added here or to the Redialer.
func TestRedialerHasTheClientsCalls(t *testing.T) {
	oneConnection := map[string]string{
		"Done": "the end of one connection", "Err": "why one connection ended", "Hello": "one engine's greeting",
		"KernelsSince": "a listing generation of one connection", "Spares": "the dashboard's header",
		"SetLimits": "the dashboard's keys", "ShutdownOwner": "the dashboard's keys", "Cells": "the dashboard's detail view",
	}
	r := reflect.TypeFor[*client.Redialer]()
	c := reflect.TypeFor[*client.Client]()
	for i := range c.NumMethod() {
		m := c.Method(i)
		if _, skip := oneConnection[m.Name]; skip {
			continue
		}
		rm, ok := r.MethodByName(m.Name)
		if !ok {
			t.Errorf("Redialer lacks Client.%s", m.Name)
			continue
		}
		if rm.Type.NumIn() != m.Type.NumIn() || rm.Type.NumOut() != m.Type.NumOut() {
			t.Errorf("Redialer.%s is %v, Client.%s is %v", m.Name, rm.Type, m.Name, m.Type)
		}
	}
}
