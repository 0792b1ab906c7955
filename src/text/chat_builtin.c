/*
 * chat_builtin.c - the built-in chat templates; see chat_builtin.h.
 *
 * Written with `{%- -%}` everywhere so that the text between tags is the
 * only output: no stray newlines whatever the trim settings.
 */
#include "text/chat_builtin.h"

#include <string.h>

typedef struct builtin {
    const char *name, *text;
} builtin;

/* <|im_start|>role\ncontent<|im_end|>\n (Qwen, SmolLM, Hermes, ...) */
static const char CHATML[] =
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}";

/* [INST] with an optional <<SYS>> block in the first user turn. */
static const char LLAMA2[] =
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if message['role'] == 'user' -%}"
    "{%- if loop.first and system -%}"
    "{{- bos_token + '[INST] <<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + message['content'] | trim + ' [/INST]' -}}"
    "{%- else -%}{{- bos_token + '[INST] ' + message['content'] | trim + ' [/INST]' -}}{%- endif -%}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{- ' ' + message['content'] | trim + ' ' + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}";

/* Llama 3: header ids around each role, <|eot_id|> after each turn. */
static const char LLAMA3[] =
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}";

/* Mistral instruct: the system text goes before the first user message. */
static const char MISTRAL[] =
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- if message['role'] == 'user' -%}"
    "{{- '[INST] ' + (system if loop.first else '') + message['content'] + ' [/INST]' -}}"
    "{%- elif message['role'] == 'assistant' -%}{{- message['content'] + eos_token -}}"
    "{%- endif -%}"
    "{%- endfor -%}";

/* Phi-3: <|role|>\ncontent<|end|>\n; eos closes a finished conversation. */
static const char PHI3[] =
    "{%- for message in messages -%}"
    "{%- if message['role'] in ['user', 'assistant'] or (message['role'] == 'system' and message['content']) -%}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}";

/* Gemma: user/model turns; a system message is folded into the first user
 * turn (the published template refuses it). */
static const char GEMMA[] =
    "{{- bos_token -}}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{%- set system = messages[0]['content'] | trim + '\\n\\n' -%}{%- set turns = messages[1:] -%}"
    "{%- else -%}{%- set system = '' -%}{%- set turns = messages -%}{%- endif -%}"
    "{%- for message in turns -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\\n' + (system if loop.first else '') + message['content'] | trim + '<end_of_turn>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}";

static const builtin BUILTINS[] = {
    {"chatml", CHATML}, {"llama2", LLAMA2}, {"llama3", LLAMA3},
    {"mistral", MISTRAL}, {"phi3", PHI3}, {"gemma", GEMMA},
};

const char *kt_chat_builtin(const char *name) {
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (strcmp(BUILTINS[i].name, name) == 0) return BUILTINS[i].text;
    return NULL;
}

const char *kt_chat_builtin_names(void) {
    return "chatml, llama2, llama3, mistral, phi3, gemma";
}
