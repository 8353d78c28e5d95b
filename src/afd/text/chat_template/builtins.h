// Built-in filters, tests, attribute/method access and global functions of the chat-template
// interpreter (Jinja2's, plus transformers' tojson, raise_exception and strftime_now). Each throws
// afd::Error with a plain message; the interpreter adds the template line.
#pragma once

#include <functional>
#include <string>

#include "afd/text/chat_template/value.h"

namespace afd::text::chat_template {

// Applies test `name` to `value` with `args` (`value is name(args)`).
bool ApplyTest(const std::string& name, const Value& value, Args& args);

// Applies filter `name` to `value` (`value | name(args)`).
Value ApplyFilter(const std::string& name, const Value& value, Args& args);

// `obj.name`: a dict key (or dict method), a string/dict method bound to obj, else undefined.
Value GetAttr(const Value& obj, const std::string& name);
// `obj[key]`: list index (negative from the end), dict key, string character; else undefined.
Value GetItem(const Value& obj, const Value& key);
// `obj[start:stop:step]` for lists and strings (null Values = omitted).
Value GetSlice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Argument `index` (or keyword `name`) of a call, or `fallback` when absent.
Value Arg(const Args& args, size_t index, const char* name, Value fallback = Value());
// Python < for the values sort/min/max/lt compare (numbers, strings); throws otherwise.
bool SortLess(const Value& a, const Value& b);
// The bound dict method `d.name` (items, keys, values, get), or undefined.
Value DictMethod(const Value& d, const std::string& name);
// The attribute of `item` named by a dotted path ("function.name", "0"), as map/selectattr use.
Value AttributeOf(const Value& item, const Value& attribute);

// Fills `globals` (a dict) with range, namespace, dict, raise_exception and strftime_now.
void AddGlobalFunctions(Value* globals);

}  // namespace afd::text::chat_template
