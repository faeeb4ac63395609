// Package docs holds policyd's reference pages; its tests check that every
// relative link in them and in the README resolves and that the README stays
// a front door of about 300 lines.
package docs
