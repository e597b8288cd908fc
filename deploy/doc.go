// Package deploy holds no Go code: it is the home of the deployment files
// (Prometheus scrape configuration, alerting rules and their unit tests, the
// Grafana dashboard and its provisioning) and of the tests that check them:
// promtool validates and unit-tests the rules and the dashboard's
// expressions, and every metric and label they use must be one envoy-rls
// exports (pkg/metrics).
package deploy
