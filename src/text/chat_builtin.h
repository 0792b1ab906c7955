/*
 * chat_builtin.h - chat templates kettle ships for model files that carry
 * none (`tokenizer.chat_template` absent) or when the user names one with
 * `--chat-template NAME`: chatml, llama2, llama3, mistral, phi3, gemma.
 *
 * They are Jinja text run by the same interpreter as the models' own
 * templates. They render what the families' published templates render for
 * plain conversations; where a published template refuses something common
 * (gemma has no system role), the built-in one folds it in instead of
 * failing, as a user without the original template would want.
 */
#ifndef KT_TEXT_CHAT_BUILTIN_H
#define KT_TEXT_CHAT_BUILTIN_H

/* The template text of a built-in template, or NULL if there is none of
 * that name. */
const char *kt_chat_builtin(const char *name);
/* "chatml, llama2, ..." for messages. */
const char *kt_chat_builtin_names(void);

#endif
