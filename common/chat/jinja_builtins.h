// The filters, tests and methods of the chat-template interpreter (jinja.h), with Python's
// semantics. Each throws jinja::Error ("line N: ...") on a bad argument. Internal.
#pragma once

#include <string>
#include <vector>

#include "common/chat/jinja_value.h"

namespace specloop {
namespace jinja {

// value | name(args, kwargs). Unknown filter: Error.
Value ApplyFilter(const std::string& name, const Value& value, const std::vector<Value>& args,
                  const Kwargs& kwargs, int line);

// value is name(args). Unknown test: Error.
bool ApplyTest(const std::string& name, const Value& value, const std::vector<Value>& args,
               int line);

// value.name(args, kwargs) for the methods of str (strip, split, startswith, ...) and dict
// (get, items, keys, values). False when `value` has no such method.
bool CallMethod(const Value& value, const std::string& name, const std::vector<Value>& args,
                const Kwargs& kwargs, int line, Value* out);

// Items of a for loop over `value`: a list's elements, a dict's keys, a string's code points;
// undefined gives none. Error for anything else.
Array Iterate(const Value& value, int line);

}  // namespace jinja
}  // namespace specloop
