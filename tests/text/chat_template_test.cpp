// Chat-template behavior that needs no reference: error messages name the template line,
// unsupported tags are refused, raise_exception's message reaches the caller.
#include "afd/text/chat_template/chat_template.h"

#include <gtest/gtest.h>

#include "afd/common/error.h"

namespace afd::text {
namespace {

using json = nlohmann::ordered_json;

std::string ErrorOf(const std::string& source, const json& context = json::object()) {
  try {
    ChatTemplate(source).Render(context);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(text_ChatTemplate, RendersMessages) {
  const json ctx = {{"messages", {{{"role", "user"}, {"content", "hi"}}}},
                    {"add_generation_prompt", true}};
  EXPECT_EQ(ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
                .Render(ctx),
            "<user>hi\n<assistant>");
}

TEST(text_ChatTemplate, RuntimeErrorsNameTheLine) {
  const std::string e = ErrorOf("line one\n{% if true %}\n{{ x.y.z }}\n{% endif %}");
  EXPECT_NE(e.find("chat template line 3"), std::string::npos) << e;
  EXPECT_NE(ErrorOf("\n\n{{ 1 + 'a' }}").find("line 3"), std::string::npos);
  EXPECT_NE(ErrorOf("{{ [1] | nosuchfilter }}").find("unknown filter 'nosuchfilter'"),
            std::string::npos);
}

TEST(text_ChatTemplate, SyntaxErrorsNameTheLine) {
  EXPECT_NE(ErrorOf("a\nb\n{% for x in y %}\n").find("missing {% endfor %}"), std::string::npos);
  const std::string e = ErrorOf("a\n{{ (1 + }}");
  EXPECT_NE(e.find("chat template line 2"), std::string::npos) << e;
  EXPECT_NE(ErrorOf("{% include 'other.jinja' %}").find("unsupported tag 'include'"),
            std::string::npos);
  EXPECT_NE(ErrorOf("{{ 'unterminated }}").find("unterminated string"), std::string::npos);
}

TEST(text_ChatTemplate, RaiseException) {
  const std::string e = ErrorOf("{{ raise_exception('Roles must alternate user/assistant') }}");
  EXPECT_NE(e.find("Roles must alternate user/assistant"), std::string::npos) << e;
}

TEST(text_ChatTemplate, NamespaceOnlyAssignment) {
  EXPECT_NE(ErrorOf("{% set d = {} %}{% set d.x = 1 %}").find("not a namespace"),
            std::string::npos);
}

TEST(text_ChatTemplate, FloatReprMatchesPython) {
  EXPECT_EQ(ChatTemplate("{{ a }} {{ b }} {{ c }} {{ d }} {{ e }}")
                .Render({{"a", 1.0}, {"b", 0.1}, {"c", 1e16}, {"d", 1.5e-7}, {"e", 123456.789}}),
            "1.0 0.1 1e+16 1.5e-07 123456.789");
}

}  // namespace
}  // namespace afd::text
