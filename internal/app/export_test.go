package app

// PrefixOf is prefixOf, for tests.
var PrefixOf = prefixOf
